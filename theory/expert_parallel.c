/* Expert parallelism (lab08): what uniform routing predicts (its all-to-all
 * bytes are th_ep_layer_traffic, in traffic.c beside the other collectives). */
#include "theory.h"

double th_ep_tokens_per_expert_uniform(long tokens, int top_k, int experts) {
    return (double)top_k * (double)tokens / experts;
}
