/*
 * An LD_PRELOAD shim that fails I/O with EIO, for the fault suite (tests/fault/tests/io_errors.rs).
 *
 * It wraps write, pwrite, pwrite64, fsync and fdatasync. A call counts when its file's path
 * (read from /proc/self/fd) contains BATON_EIO_MATCH and the control file BATON_EIO_CONTROL
 * exists. The control file holds three numbers, "GENERATION K PERSISTENT": the counter starts
 * at zero for each new generation, the K-th counted call fails, and so does every later one
 * when PERSISTENT is 1 (once-only when 0). Without the control file every call passes through.
 *
 * The test owns the control file: writing a new generation arms a fault, removing it heals.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static long current_generation = -1;
static long counted = 0;

/* Whether this call on fd must fail; counts it when it matches and a fault is armed. */
static int should_fail(int fd) {
    const char *match = getenv("BATON_EIO_MATCH");
    const char *control = getenv("BATON_EIO_CONTROL");
    if (!match || !control) return 0;
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return 0;
    path[n] = 0;
    if (!strstr(path, match)) return 0;
    /* Read the control file with raw syscalls: never through the wrapped functions. */
    int cfd = open(control, O_RDONLY | O_CLOEXEC);
    if (cfd < 0) return 0;
    char buf[128];
    ssize_t r = read(cfd, buf, sizeof buf - 1);
    close(cfd);
    if (r <= 0) return 0;
    buf[r] = 0;
    long generation = 0, k = 0, persistent = 0;
    if (sscanf(buf, "%ld %ld %ld", &generation, &k, &persistent) != 3) return 0;
    int fail = 0;
    pthread_mutex_lock(&lock);
    if (generation != current_generation) {
        current_generation = generation;
        counted = 0;
    }
    counted++;
    fail = persistent ? counted >= k : counted == k;
    pthread_mutex_unlock(&lock);
    return fail;
}

typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);
typedef ssize_t (*pwrite64_fn)(int, const void *, size_t, off64_t);
typedef int (*sync_fn)(int);

/* The next definition of `name` (libc's), looked up once. */
#define REAL(name, type) \
    static type real_##name; \
    if (!real_##name) real_##name = (type)dlsym(RTLD_NEXT, #name)

ssize_t write(int fd, const void *buf, size_t count) {
    REAL(write, write_fn);
    if (should_fail(fd)) { errno = EIO; return -1; }
    return real_write(fd, buf, count);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t off) {
    REAL(pwrite, pwrite_fn);
    if (should_fail(fd)) { errno = EIO; return -1; }
    return real_pwrite(fd, buf, count, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off64_t off) {
    REAL(pwrite64, pwrite64_fn);
    if (should_fail(fd)) { errno = EIO; return -1; }
    return real_pwrite64(fd, buf, count, off);
}

int fsync(int fd) {
    REAL(fsync, sync_fn);
    if (should_fail(fd)) { errno = EIO; return -1; }
    return real_fsync(fd);
}

int fdatasync(int fd) {
    REAL(fdatasync, sync_fn);
    if (should_fail(fd)) { errno = EIO; return -1; }
    return real_fdatasync(fd);
}
