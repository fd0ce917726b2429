/* Expert parallelism (lab08): what uniform routing predicts. */
#include "theory.h"

double th_ep_alltoall_uniform(int N, long tokens, int top_k, long d_model, double value_bytes) {
    if (N <= 1) return 0;
    /* k rows per token leave in the dispatch, come back in the combine, and the
     * backward moves their gradients the same two ways: 4 k rows, of which
     * (N-1)/N go to experts on other ranks */
    return 4.0 * top_k * (double)tokens * (double)d_model * value_bytes * (N - 1.0) / N;
}

double th_ep_tokens_per_expert_uniform(long tokens, int top_k, int experts) {
    return (double)top_k * (double)tokens / experts;
}
