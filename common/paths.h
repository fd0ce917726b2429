/* The files a run reads and writes, checked at start-up before any work, and
 * the temporary files of atomic writes.
 *
 * Inputs are looked at (stat) before they are opened: opening a FIFO blocks
 * until someone writes to it, and a device such as /dev/zero never ends, so
 * only regular files of a bounded size are read. Outputs are proven writable
 * by creating and removing a file where they go (root passes access(W_OK) on
 * a read-only file system, and a test of the folder alone misses a name too
 * long for the temporary). Every message is one line, "FLAG PATH: reason". */
#ifndef PL_PATHS_H
#define PL_PATHS_H
#include <stddef.h>

/* The folder of path: "dir" of "dir/file", "." of "file", "/" of "/file". malloc'd. */
char *path_folder(const char *path);

/* "folder/name", malloc'd. */
char *path_join(const char *folder, const char *name);

/* "PATH.tmp.PID": where an atomic write of path puts its data before the
 * rename (the same folder, so the rename is atomic). malloc'd. */
char *path_temp_name(const char *path);

/* Opens an input file for reading: refuses what is not a regular file (a
 * folder, FIFO, device or socket) and, max_bytes >= 0, one larger than that.
 * Returns the descriptor and its size in *size, or -1 with the reason in err. */
int path_open_input(const char *flag, const char *path, long long max_bytes, long long *size, char *err,
                    size_t errlen);
/* read() until n bytes came: 0, or -1 (errno 0: the file ended first). */
int path_read_exact(int fd, void *buf, size_t n);

/* A file this process will write (or replace): refuses a folder or another
 * non-regular file at path and a folder of it that is missing or no folder,
 * then creates and removes path's temporary name (path_temp_name) there.
 * 0, or -1 with the reason in err. Leaves nothing behind. */
int path_check_output_file(const char *flag, const char *path, char *err, size_t errlen);

/* A folder the run will create if needed (--out): an existing folder, or a
 * path whose nearest existing ancestor is a folder; the folder that exists is
 * proven writable by creating and removing a file in it. Creates nothing. */
int path_check_output_folder(const char *flag, const char *dir, char *err, size_t errlen);

/* mkdir -p: 0, or -1 with errno. */
int path_make_folder(const char *dir);

/* Removes path's temporaries (path_temp_name) left by processes of this host
 * that no longer exist, such as a save killed half-way. */
void path_remove_stale_temps(const char *path);

/* While tmp is being written: SIGINT and SIGTERM remove it, then end the
 * process as they would have. NULL: back to what the signals did before. */
void path_remove_on_signal(const char *tmp);

/* The file an atomic write of path fills: where the system allows, a file
 * without a name in path's folder (O_TMPFILE), which the kernel frees if the
 * process dies, by any signal; else path's temporary name, tmp. A handler
 * cannot be relied on for that: mpirun, given SIGTERM or Ctrl-C, forwards it
 * to every rank and SIGKILLs the others milliseconds after the first one ends,
 * while a rank inside a long write() or fsync() runs no handler until the call
 * returns. Returns the descriptor (-1, errno set, on failure) and whether the
 * file has a name yet in *named. */
int path_create_for_rename(const char *path, const char *tmp, int *named);
/* Gives the complete file of path_create_for_rename (fd still open) the name
 * tmp, for the rename onto path; nothing if it has it already. 0, or -1. */
int path_name_for_rename(int fd, const char *tmp, int named);

#endif
