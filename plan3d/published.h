/* plan3d --published: the throughput of published training runs, predicted from their layouts. */
#ifndef PLAN3D_PUBLISHED_H
#define PLAN3D_PUBLISHED_H

/* plan3d --published FILE: each row's throughput predicted from its layout;
 * json: where to write the rows (NULL: nowhere). */
int predict_published(const char *path, const char *json);

#endif
