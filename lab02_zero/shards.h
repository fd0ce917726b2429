/* How ZeRO cuts the flat parameter layout into shards: arithmetic on ranges.
 *
 * The layout is split into units, runs of whole blocks (the embedding, a
 * layer, the head) that each travel in one collective. A unit of n elements is
 * cut into N chunks of comm_chunk(n, N) elements, the last one padded, and rank
 * r owns chunk r of every unit. Then a unit's reduce-scatter leaves each rank
 * exactly the gradient of its own chunk, and the unit's all-gather rebuilds the
 * whole unit from everyone's chunks.
 *
 * Two kinds of buffer follow from that:
 *   a full buffer  every unit padded to chunk x N elements, back to back: what
 *                  a unit's collectives read and write (stage 1 and 2 keep the
 *                  parameters like this; stage 1 the gradients too);
 *   a shard        this rank's chunk of every unit, back to back: what a rank
 *                  keeps of what ZeRO shards (AdamW moments in every stage,
 *                  gradients from stage 2, parameters in stage 3).
 *
 * Why units and not one cut of the whole model: stage 2 must reduce-scatter
 * gradients while the backward produces them, and stage 3 must gather one layer
 * at a time; both need a collective per piece, and with equal chunks per piece
 * ownership must be decided per piece. */
#ifndef LAB02_SHARDS_H
#define LAB02_SHARDS_H
#include "model.h"

/* Blocks are numbered like gpt_for_each_tensor's `layer`: -1 the embedding,
 * 0 .. L-1 the layers, L the head. The model range of one block: */
void block_range(const gpt_layout *g, int block, long *begin, long *end);

typedef struct shard_unit {
    long begin, end;              /* model offsets, whole blocks */
    int first_block, last_block;  /* the blocks inside, lowest and highest */
    long chunk;                   /* comm_chunk(end - begin, ranks): one rank's share */
    long full_offset;             /* where the unit starts in a full buffer */
    long shard_offset;            /* where this rank's chunk starts in a shard */
} shard_unit;

typedef struct shard_plan {
    int ranks, rank;
    int n_units;
    shard_unit *units;       /* in layout order: units[0] holds the embedding */
    int *unit_of_block;      /* [block + 1] */
    long full_elems;         /* sum of chunk x ranks */
    long shard_elems;        /* sum of chunk */
    long padding_elems;      /* full_elems - model elements */
    long largest_unit_elems; /* max of chunk x ranks: a bucket, a gathered unit */
} shard_plan;

/* Units of at least unit_elems elements, grouped from the head down as the
 * backward finishes blocks (lab01's bucket rule; the remainder is the unit that
 * holds the embedding). unit_elems <= 0: the whole model is one unit;
 * 1: every block is a unit of its own. */
void shard_plan_init(shard_plan *p, const gpt_layout *g, int ranks, int rank, long unit_elems);
void shard_plan_free(shard_plan *p);

const shard_unit *shard_unit_of_block(const shard_plan *p, int block);
/* The model range this rank owns in unit u: [begin + rank x chunk, ...) cut at
 * the unit's end; empty (begin == end) when the padding covers all of it. */
void shard_owned_range(const shard_plan *p, const shard_unit *u, long *begin, long *end);

#endif
