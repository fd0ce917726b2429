/* plan3d --check: the labs' run records, each predicted from its own flags. */
#ifndef PLAN3D_CHECK_H
#define PLAN3D_CHECK_H

/* plan3d --check DIR: every record of DIR/records.jsonl predicted from its own
 * flags. Returns 0 if memory and bytes all match, 1 if any does not, 2 on bad
 * input. json: where to write the comparison (NULL: nowhere). */
int check_records(const char *dir, const char *calibration_path, const char *json);

#endif
