/* The config theory/predict.h predicts a run from (th_run), in the run's
 * record as its member "th_run": every lab writes the th_run its memory check
 * and --dry-run used (lab_main), plan3d --check reads it back. One field table
 * serves the encoder and the decoder, so the two cannot disagree on a field,
 * and nothing downstream needs to know which lab ran. */
#ifndef PL_TH_RUN_JSON_H
#define PL_TH_RUN_JSON_H
#include "predict.h"
#include <jansson.h>
#include <stddef.h>

/* A new object (never NULL: out of memory dies). */
json_t *th_run_to_json(const th_run *r);
/* 1 with *r filled; 0 with why: the member's path ("th_run.model.heads"), its
 * value and what it must be, or what is missing. */
int th_run_from_json(json_t *o, th_run *r, char *why, size_t len);

#endif
