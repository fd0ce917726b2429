#include "shards.h"
#include "comm.h"
#include "device.h"
#include <stdlib.h>

void block_range(const gpt_layout *g, int block, long *begin, long *end) {
    int L = g->cfg.layers;
    *begin = block < 0 ? 0 : gpt_layer_offset(g, block);
    *end = block < 0 ? g->embed_size : block == L ? g->total : gpt_layer_offset(g, block + 1);
}

void shard_plan_init(shard_plan *p, const gpt_layout *g, int ranks, int rank, long unit_elems) {
    int L = g->cfg.layers, n_blocks = L + 2;
    *p = (shard_plan){.ranks = ranks, .rank = rank};
    p->units = calloc((size_t)n_blocks, sizeof *p->units);
    p->unit_of_block = calloc((size_t)n_blocks, sizeof *p->unit_of_block);
    if (!p->units || !p->unit_of_block) die("out of host memory");

    /* Group blocks from the head down, closing a unit once it holds unit_elems:
     * the order the backward finishes them, so a unit is complete the moment
     * its lowest block's backward returns. Filled from the back of the array,
     * so units[] ends up in layout order. */
    int slot = n_blocks;
    long hi = g->total;
    int hi_block = L;
    for (int b = L; b >= -1; b--) {
        long begin, end;
        block_range(g, b, &begin, &end);
        int close = b == -1 || (unit_elems > 0 && hi - begin >= unit_elems);
        if (!close) continue;
        p->units[--slot] = (shard_unit){.begin = begin, .end = hi, .first_block = b, .last_block = hi_block};
        hi = begin;
        hi_block = b - 1;
    }
    p->n_units = n_blocks - slot;
    for (int u = 0; u < p->n_units; u++) p->units[u] = p->units[slot + u];

    for (int u = 0; u < p->n_units; u++) {
        shard_unit *s = &p->units[u];
        s->chunk = comm_chunk(s->end - s->begin, ranks);
        s->full_offset = p->full_elems;
        s->shard_offset = p->shard_elems;
        p->full_elems += s->chunk * ranks;
        p->shard_elems += s->chunk;
        if (s->chunk * ranks > p->largest_unit_elems) p->largest_unit_elems = s->chunk * ranks;
        for (int b = s->first_block; b <= s->last_block; b++) p->unit_of_block[b + 1] = u;
    }
    p->padding_elems = p->full_elems - g->total;
}

void shard_plan_free(shard_plan *p) {
    free(p->units);
    free(p->unit_of_block);
    *p = (shard_plan){0};
}

const shard_unit *shard_unit_of_block(const shard_plan *p, int block) {
    return &p->units[p->unit_of_block[block + 1]];
}

void shard_owned_range(const shard_plan *p, const shard_unit *u, long *begin, long *end) {
    long b = u->begin + (long)p->rank * u->chunk, e = b + u->chunk;
    *begin = b < u->end ? b : u->end;
    *end = e < u->end ? e : u->end;
}
