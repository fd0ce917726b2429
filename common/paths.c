#define _GNU_SOURCE /* O_TMPFILE, linkat */
#include "paths.h"
#include "device.h" /* die */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *copy(const char *s, size_t n) {
    char *c = strndup(s, n);
    if (!c) die("out of host memory");
    return c;
}

char *path_folder(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return copy(".", 1);
    return copy(path, slash == path ? 1 : (size_t)(slash - path));
}

static char *joined(const char *a, const char *sep, const char *b, long number) {
    size_t n = strlen(a) + strlen(sep) + strlen(b) + 24;
    char *s = malloc(n);
    if (!s) die("out of host memory");
    if (number >= 0) snprintf(s, n, "%s%s%s%ld", a, sep, b, number);
    else snprintf(s, n, "%s%s%s", a, sep, b);
    return s;
}

char *path_join(const char *folder, const char *name) { return joined(folder, "/", name, -1); }

char *path_temp_name(const char *path) { return joined(path, "", ".tmp.", (long)getpid()); }

static const char *kind_of(mode_t m) {
    return S_ISDIR(m) ? "a folder" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device"
         : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

int path_open_input(const char *flag, const char *path, long long max_bytes, long long *size, char *err,
                    size_t errlen) {
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, "%s %s: %s", flag, path, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s %s: %s, not a regular file", flag, path, kind_of(st.st_mode));
        return -1;
    }
    /* O_NONBLOCK: should the name have become a FIFO since the stat, open returns at once */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s %s: %s", flag, path, fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0) close(fd);
        return -1;
    }
    if (max_bytes >= 0 && (long long)st.st_size > max_bytes) {
        snprintf(err, errlen, "%s %s: %lld bytes, more than the limit of %lld", flag, path, (long long)st.st_size,
                 max_bytes);
        close(fd);
        return -1;
    }
    *size = (long long)st.st_size;
    return fd;
}

int path_read_exact(int fd, void *buf, size_t n) {
    char *p = buf;
    while (n > 0) {
        ssize_t k = read(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            if (k == 0) errno = 0;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Create and remove `probe`: the one test of writability that root cannot pass by privilege. */
static int probe(const char *flag, const char *shown, const char *folder, const char *probe, char *err,
                 size_t errlen) {
    int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "%s %s: cannot create a file in %s: %s", flag, shown, folder, strerror(errno));
        return -1;
    }
    close(fd);
    unlink(probe);
    return 0;
}

int path_check_output_file(const char *flag, const char *path, char *err, size_t errlen) {
    struct stat st;
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            snprintf(err, errlen, "%s %s: is a folder, give a file name", flag, path);
            return -1;
        }
        if (!S_ISREG(st.st_mode)) {
            snprintf(err, errlen, "%s %s: is %s, not a regular file; refusing to replace it", flag, path,
                     kind_of(st.st_mode));
            return -1;
        }
    } else if (errno != ENOENT) {
        snprintf(err, errlen, "%s %s: %s", flag, path, strerror(errno));
        return -1;
    }
    char *folder = path_folder(path);
    int rc = -1;
    if (stat(folder, &st) != 0)
        snprintf(err, errlen, "%s %s: its folder %s: %s", flag, path, folder, strerror(errno));
    else if (!S_ISDIR(st.st_mode))
        snprintf(err, errlen, "%s %s: %s is not a folder", flag, path, folder);
    else {
        char *tmp = path_temp_name(path);
        rc = probe(flag, path, folder, tmp, err, errlen);
        free(tmp);
    }
    free(folder);
    return rc;
}

int path_check_output_folder(const char *flag, const char *dir, char *err, size_t errlen) {
    struct stat st;
    char *at = copy(dir, strlen(dir));
    /* the folder itself, or else its nearest ancestor that exists */
    while (stat(at, &st) != 0) {
        if (errno != ENOENT) {
            snprintf(err, errlen, "%s %s: %s", flag, dir, strerror(errno));
            free(at);
            return -1;
        }
        char *up = path_folder(at);
        if (!strcmp(up, at)) {
            snprintf(err, errlen, "%s %s: no part of the path exists", flag, dir);
            free(up);
            free(at);
            return -1;
        }
        free(at);
        at = up;
    }
    int rc = -1;
    if (!S_ISDIR(st.st_mode)) {
        if (!strcmp(at, dir)) snprintf(err, errlen, "%s %s: exists and is not a folder", flag, dir);
        else snprintf(err, errlen, "%s %s: %s is not a folder", flag, dir, at);
    } else {
        char *test = joined(at, "/", ".pl-write-test.", (long)getpid());
        rc = probe(flag, dir, at, test, err, errlen);
        free(test);
    }
    free(at);
    return rc;
}

int path_make_folder(const char *dir) {
    char *buf = copy(dir, strlen(dir));
    int rc = 0;
    for (char *p = buf + 1; *p && rc == 0; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0777) && errno != EEXIST) rc = -1;
        *p = '/';
    }
    if (rc == 0 && mkdir(buf, 0777) && errno != EEXIST) rc = -1;
    free(buf);
    return rc;
}

void path_remove_stale_temps(const char *path) {
    char *folder = path_folder(path);
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    size_t n = strlen(base);
    DIR *d = opendir(folder);
    for (struct dirent *e; d && (e = readdir(d));) {
        const char *name = e->d_name, *digits = name + n + 5;
        if (strncmp(name, base, n) || strncmp(name + n, ".tmp.", 5) || !*digits) continue;
        char *end;
        errno = 0;
        long pid = strtol(digits, &end, 10);
        if (*end || errno || pid <= 0 || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* its writer still runs */
        char *stale = joined(folder, "/", name, -1);
        struct stat st;
        if (lstat(stale, &st) == 0 && S_ISREG(st.st_mode) && unlink(stale) == 0) {
            printf("removed %s, left by a write that did not finish\n", stale);
            fflush(stdout);
        }
        free(stale);
    }
    if (d) closedir(d);
    free(folder);
}

static char *signal_tmp; /* read by the handler; set only while no signal is handled */
static struct sigaction old_int, old_term;

static void remove_and_die(int sig) {
    if (signal_tmp) unlink(signal_tmp); /* async-signal-safe */
    raise(sig); /* SA_RESETHAND put the default action back: the process ends as it would have */
}

void path_remove_on_signal(const char *tmp) {
    if (signal_tmp) {
        sigaction(SIGINT, &old_int, NULL);
        sigaction(SIGTERM, &old_term, NULL);
        free(signal_tmp);
        signal_tmp = NULL;
    }
    if (!tmp) return;
    signal_tmp = copy(tmp, strlen(tmp));
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = remove_and_die;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    /* a signal the process ignored (a job started in the background) stays ignored */
    if (old_int.sa_handler == SIG_IGN) sigaction(SIGINT, &old_int, NULL);
    if (old_term.sa_handler == SIG_IGN) sigaction(SIGTERM, &old_term, NULL);
}

int path_create_for_rename(const char *path, const char *tmp, int *named) {
#ifdef O_TMPFILE
    /* linkat through /proc/self/fd names it later without a privilege */
    if (access("/proc/self/fd", X_OK) == 0) {
        char *folder = path_folder(path);
        int fd = open(folder, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
        free(folder);
        *named = 0;
        if (fd >= 0) return fd;
        /* file systems without it (EOPNOTSUPP, EISDIR on old kernels): the named temporary */
        if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) return -1;
    }
#endif
    *named = 1;
    return open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
}

int path_name_for_rename(int fd, const char *tmp, int named) {
    if (named) return 0;
    char self[64];
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    unlink(tmp); /* one left by a process of this pid before: linkat does not replace */
    return linkat(AT_FDCWD, self, AT_FDCWD, tmp, AT_SYMLINK_FOLLOW);
}
