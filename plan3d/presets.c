#include "presets.h"
#include <string.h>

/* GPT shapes: learned positions, biases, a 4C GELU MLP, the head tied to the
 * embedding, dropout (GPT-2, GPT-3, Megatron's GPT). */
#define GPT(L, C, H, T, V) {.vocab = V, .seq = T, .layers = L, .d_model = C, .heads = H, .kv_heads = H, \
                            .ffn = 4 * (C), .biases = 1, .learned_positions = 1, .tied_head = 1, \
                            .dropout = 1}
/* Llama 3: grouped-query attention (8 KV heads), SwiGLU MLP, RMSNorm without
 * biases, rotary positions, untied head, no dropout. */
#define LLAMA(L, C, H, F) {.vocab = 128256, .seq = 8192, .layers = L, .d_model = C, .heads = H, .kv_heads = 8, \
                           .ffn = F, .gated_mlp = 1}

const model_preset model_presets[] = {
    {"course", {.vocab = 256, .seq = 64, .layers = 8, .d_model = 128, .heads = 4, .kv_heads = 4, .ffn = 512,
                .biases = 1, .learned_positions = 1},
     "the labs' default model (common/model.h): GPT-2's layer, vocab 256, untied head"},
    {"gpt2-124m", GPT(12, 768, 12, 1024, 50257), "GPT-2 small (Radford et al. 2019): 124M parameters"},
    {"gpt3-175b", GPT(96, 12288, 96, 2048, 51200),
     "GPT-3 175B (Brown et al. 2020, Table 2.1); vocab padded to 51200 as Megatron-LM does"},
    {"llama3-8b", LLAMA(32, 4096, 32, 14336), "Llama 3 8B (Llama 3 report, Table 3): GQA, SwiGLU, RMSNorm, RoPE"},
    {"llama3-70b", LLAMA(80, 8192, 64, 28672), "Llama 3 70B (Llama 3 report, Table 3): GQA, SwiGLU, RMSNorm, RoPE"},
    {"llama3-405b", LLAMA(126, 16384, 128, 53248), "Llama 3 405B (Llama 3 report, Table 3): GQA, SwiGLU, RMSNorm, RoPE"},
    /* Narayanan et al. 2021 (Megatron-LM on GPU clusters), Table 1: vocab 51200, seq 2048 */
    {"megatron-18b", GPT(40, 6144, 48, 2048, 51200), "Megatron-LM 2021, Table 1: 18.4B"},
    {"megatron-39b", GPT(48, 8192, 64, 2048, 51200), "Megatron-LM 2021, Table 1: 39.1B"},
    {"megatron-76b", GPT(60, 10240, 80, 2048, 51200), "Megatron-LM 2021, Table 1: 76.1B"},
    {"megatron-145b", GPT(80, 12288, 96, 2048, 51200), "Megatron-LM 2021, Table 1: 145.6B"},
    {"megatron-310b", GPT(96, 16384, 128, 2048, 51200), "Megatron-LM 2021, Table 1: 310.1B"},
    {"megatron-530b", GPT(105, 20480, 128, 2048, 51200), "Megatron-LM 2021, Table 1: 529.6B"},
    {"megatron-1t", GPT(128, 25600, 160, 2048, 51200), "Megatron-LM 2021, Table 1: 1008B"},
    {"mt-nlg-530b", GPT(105, 20480, 128, 2048, 50272), "MT-NLG 530B (Smith et al. 2022, section 2)"},
    /* Mixture of experts. Mixtral: every layer's MLP is 8 SwiGLU experts of
     * Mistral 7B's width, top-2 (Jiang et al. 2024, arXiv 2401.04088, Table 1:
     * 46.7B total, 12.9B active). DeepSeek-V3 (arXiv 2412.19437, section 4.2):
     * 256 routed experts of width 2048, top-8, 1 shared expert, the first 3
     * layers dense (18432), 671B total, 37B active. Its multi-head latent
     * attention (low-rank K/V and Q projections) is not modelled: standard
     * multi-head attention of its 128 heads over d_model 7168 stands in
     * (205M parameters a layer where MLA has 187M; 1.1B more over 61 layers). */
    {"mixtral-8x7b", {.vocab = 32000, .seq = 32768, .layers = 32, .d_model = 4096, .heads = 32, .kv_heads = 8,
                      .ffn = 14336, .gated_mlp = 1, .experts = 8, .top_k = 2},
     "Mixtral 8x7B (arXiv 2401.04088, Table 1): 8 SwiGLU experts top-2 per layer, GQA, RoPE, untied head"},
    {"deepseek-v3", {.vocab = 129280, .seq = 4096, .layers = 61, .d_model = 7168, .heads = 128, .kv_heads = 128,
                     .ffn = 18432, .gated_mlp = 1, .experts = 256, .top_k = 8, .ffn_expert = 2048,
                     .shared_experts = 1, .dense_layers = 3, .route_max_nodes = 4},
     "DeepSeek-V3 (arXiv 2412.19437): 256 routed experts top-8 + 1 shared (width 2048), first 3 layers dense, "
     "each token's experts on at most 4 nodes; MLA as MHA"},
    /* Qwen3-235B-A22B (Qwen3 technical report, arXiv 2505.09388, Table 2; its
     * config.json): 94 layers, every MLP 128 SwiGLU experts of width 1536,
     * top-8, no shared expert; 64 query heads of 128 over d_model 4096 (Q is
     * 8192 wide), 4 K/V heads; vocab 151936, untied head, no biases. Its
     * per-head q/k RMSNorms (256 weights a layer) are left out. ffn is the
     * config's dense width, which no layer uses. 235.1B total, 22.2B active. */
    {"qwen3-235b", {.vocab = 151936, .seq = 4096, .layers = 94, .d_model = 4096, .heads = 64, .kv_heads = 4,
                    .head_dim = 128, .ffn = 12288, .gated_mlp = 1, .experts = 128, .top_k = 8, .ffn_expert = 1536},
     "Qwen3-235B-A22B (arXiv 2505.09388): 128 SwiGLU experts of 1536 top-8 per layer, 64 heads of 128 (Q 8192 wide "
     "over d_model 4096), 4 K/V heads"},
    /* ALiBi: no position table; the extra LayerNorm after the embedding is left out */
    {"bloom-176b", {.vocab = 250880, .seq = 2048, .layers = 70, .d_model = 14336, .heads = 112, .kv_heads = 112,
                    .ffn = 4 * 14336, .biases = 1, .learned_positions = 0, .tied_head = 1, .dropout = 1},
     "BLOOM 176B (BigScience 2022, arXiv 2211.05100, section 3): ALiBi, tied head, vocab 250680 padded to 250880"},
};
const int n_model_presets = (int)(sizeof model_presets / sizeof model_presets[0]);

/* Figures per GPU from the datasheets; latencies are typical NCCL step
 * latencies, not datasheet figures. Bandwidths are one direction:
 *   A100 SXM4 80GB: 312 TFLOP/s dense BF16 (624 with sparsity), 156 TF32,
 *     80 GB HBM2e at 2,039 GB/s, NVLink 3 600 GB/s both ways (300 one way)
 *     [NVIDIA A100 datasheet, nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf];
 *     DGX A100: 8 ConnectX-6 HDR 200 Gb/s NICs for compute traffic, one per GPU:
 *     25 GB/s [DGX A100 user guide / datasheet].
 *   H100 SXM5 80GB: 989 TFLOP/s dense BF16 (1,979 with sparsity), 495 TF32,
 *     80 GB HBM3 at 3.35 TB/s, NVLink 4 900 GB/s both ways (450 one way)
 *     [NVIDIA H100 datasheet]; DGX H100: 8 ConnectX-7 400 Gb/s NICs: 50 GB/s
 *     per GPU [DGX H100 datasheet].
 *   H200 SXM 141GB: the H100's compute and NVLink, 141 GB HBM3e at 4.8 TB/s
 *     [NVIDIA H200 datasheet]; 8 x 400 Gb/s NICs as the DGX H200.
 * efficiency: the fraction of dense peak that a transformer layer's forward
 * and backward (matrix products and the elementwise kernels between them,
 * without communication or bubble) reaches. One figure for every GPU, 0.57:
 * the value at which the mean error over Megatron-LM 2021's seven rows of
 * published_runs.tsv is about zero (0.565, rounded); the other six rows
 * (BLOOM, MT-NLG, Llama 3 on H100s) are predictions with it. Not fitted per
 * row; lab06_3d/README.md ("planning a real run") gives the errors. */
const cluster cluster_presets[] = {
    {"a100-80gb", 8, 8, 80, 312, 156, 0.57, 300, 3, 25, 8, 2039, 0,
     "DGX A100 80GB nodes: NVLink 3 inside (600 GB/s both ways), 8 x HDR 200 Gb/s InfiniBand between"},
    {"h100", 8, 8, 80, 989, 495, 0.57, 450, 3, 50, 8, 3350, 0,
     "DGX H100 nodes: NVLink 4 inside (900 GB/s both ways), 8 x NDR 400 Gb/s InfiniBand between"},
    {"h200", 8, 8, 131.3, 989, 495, 0.57, 450, 3, 50, 8, 4800, 0,
     "H200 SXM nodes (141 GB = 131.3 GiB): the H100's compute and links, HBM3e 4.8 TB/s"},
    /* torchtitan's benchmark hosts (pytorch/torchtitan, benchmarks/llama3_h100_202412_torchtitan.md):
     * Grand Teton, 8 H100 a host on NVLink, 96 GB HBM2e at 2.4 TB/s, 400 Gb/s
     * per GPU between hosts, a 500 W power limit. Their peak is "between SXM
     * and NVL, and we don't know its exact value" (its footnote 2): the SXM's
     * 989 stands, as in torchtitan's own MFU, an upper bound */
    {"h100-96gb", 8, 8, 89.4, 989, 495, 0.57, 450, 3, 50, 8, 2400, 0,
     "Grand Teton H100 96GB HBM2e (torchtitan's benchmarks), 500 W: the SXM's peak as an upper bound"},
    /* DeepSeek-V3's cluster (arXiv 2412.19437, section 3.2.2): NVLink 160 GB/s
     * and InfiniBand 50 GB/s per GPU as the report states them; the H800's
     * compute is the H100's */
    {"h800", 8, 8, 80, 989, 495, 0.57, 160, 3, 50, 8, 3350, 0,
     "H800 SXM nodes (DeepSeek-V3's): H100 compute, NVLink 160 GB/s and InfiniBand 50 GB/s per GPU as its report gives"},
    /* the machine the labs run on, as plan3d --calibrate measured it (--calibration) */
    {"cpu", 2, 2, 8, 0, 0, 1.0, 0, 0, 0, 0, 0, 2, "this machine's cores as ranks, measured by plan3d --calibrate"},
};
const int n_cluster_presets = (int)(sizeof cluster_presets / sizeof cluster_presets[0]);

const model_preset *find_model(const char *name) {
    for (int i = 0; i < n_model_presets; i++)
        if (!strcmp(model_presets[i].name, name)) return &model_presets[i];
    return 0;
}

const cluster *find_cluster(const char *name) {
    for (int i = 0; i < n_cluster_presets; i++)
        if (!strcmp(cluster_presets[i].name, name)) return &cluster_presets[i];
    return 0;
}
