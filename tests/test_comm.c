/* Collectives, point-to-point, polite waiting and the trace, on the CPU over MPI.
 * Run under mpirun with 1 to 4 ranks (CTest: comm_n1 .. comm_n4).
 *
 * Values are small integers (element i of rank r is r*1000 + i), so float sums
 * are exact and a wrong rank or offset shows as a wrong number. */
#define _POSIX_C_SOURCE 200809L
#include "comm.h"
#include "device.h"
#include "precision.h"
#include "trace.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int world_rank, world_size;

static void fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rank %d: FAIL ", world_rank);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}
#define CHECK(cond, ...) do { if (!(cond)) fail(__VA_ARGS__); } while (0)

static const long sizes[] = {0, 1, 5, 7, 64, 1000, 4099};
#define NSIZES (int)(sizeof sizes / sizeof sizes[0])

static float val(int r, long i) { return (float)(r * 1000 + i); }
/* sum over ranks r of val(r, i) */
static float sum_val(int size, long i) { return (float)(1000L * size * (size - 1) / 2 + size * i); }

static float *floats(long n, float fill) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    if (!p) fail("out of memory");
    for (long i = 0; i < n; i++) p[i] = fill;
    return p;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void check_stat(const comm *c, comm_kind k, long calls, double bytes, const char *where) {
    CHECK(c->stats[k].calls == calls, "%s: stats[%s].calls = %ld, expected %ld", where,
          comm_kind_names[k], c->stats[k].calls, calls);
    CHECK(c->stats[k].bytes == bytes, "%s: stats[%s].bytes = %.0f, expected %.0f", where,
          comm_kind_names[k], c->stats[k].bytes, bytes);
    CHECK(c->stats[k].seconds >= 0, "%s: negative seconds", where);
}

/* ---- collectives (run on the world and on sub-groups) ----------------------- */

static void test_allreduce(comm *c, const char *where) {
    comm_reset_stats(c);
    double bytes = 0;
    for (int s = 0; s < NSIZES; s++) {
        long n = sizes[s];
        float *b = floats(n, 0);
        for (long i = 0; i < n; i++) b[i] = val(c->rank, i);
        comm_allreduce(c, b, n, COMM_VALUES, 0);
        for (long i = 0; i < n; i++)
            CHECK(b[i] == sum_val(c->size, i), "%s allreduce sum n=%ld: [%ld] = %g, expected %g",
                  where, n, i, b[i], sum_val(c->size, i));
        for (long i = 0; i < n; i++) b[i] = val(c->rank, i);
        comm_allreduce(c, b, n, COMM_VALUES, 1);
        for (long i = 0; i < n; i++) {
            float e = sum_val(c->size, i) / (float)c->size;
            CHECK(fabsf(b[i] - e) <= 1e-6f * fabsf(e) + 1e-6f,
                  "%s allreduce average n=%ld: [%ld] = %g, expected %g", where, n, i, b[i], e);
        }
        bytes += 2.0 * 4 * n;
        free(b);
    }
    check_stat(c, COLL_ALLREDUCE, 2 * NSIZES, bytes, where);
}

/* in_place: the shard is full + rank*chunk, as a ZeRO optimizer uses it. */
static void test_reduce_scatter(comm *c, int in_place, const char *where) {
    comm_reset_stats(c);
    double bytes = 0;
    for (int s = 0; s < NSIZES; s++) {
        long n = sizes[s], chunk = comm_chunk(n, c->size);
        CHECK(chunk == (n + c->size - 1) / c->size, "comm_chunk(%ld, %d) = %ld", n, c->size, chunk);
        float *full = floats(chunk * c->size, 12345.0f); /* padding: must not matter */
        for (long i = 0; i < n; i++) full[i] = val(c->rank, i);
        float *own = floats(chunk, -7.0f);
        float *shard = in_place ? full + (long)c->rank * chunk : own;
        comm_reduce_scatter(c, full, shard, n, COMM_VALUES);
        long first = (long)c->rank * chunk;
        long valid = n - first < chunk ? n - first : chunk;
        for (long j = 0; j < valid; j++)
            CHECK(shard[j] == sum_val(c->size, first + j),
                  "%s reduce_scatter%s n=%ld: shard[%ld] = %g, expected %g", where,
                  in_place ? " in place" : "", n, j, shard[j], sum_val(c->size, first + j));
        bytes += 4.0 * chunk * c->size;
        free(full);
        free(own);
    }
    check_stat(c, COLL_REDUCE_SCATTER, NSIZES, bytes, where);
}

static void test_allgather(comm *c, int in_place, const char *where) {
    comm_reset_stats(c);
    double bytes = 0;
    for (int s = 0; s < NSIZES; s++) {
        long n = sizes[s], chunk = comm_chunk(n, c->size);
        float *full = floats(chunk * c->size, -1.0f);
        float *own = floats(chunk, -2.0f);
        float *shard = in_place ? full + (long)c->rank * chunk : own;
        long first = (long)c->rank * chunk;
        for (long j = 0; j < chunk && first + j < n; j++) shard[j] = val(c->rank, first + j);
        comm_allgather(c, shard, full, n, COMM_VALUES);
        for (long i = 0; i < n; i++)
            CHECK(full[i] == val((int)(i / chunk), i),
                  "%s allgather%s n=%ld: full[%ld] = %g, expected %g", where,
                  in_place ? " in place" : "", n, i, full[i], val((int)(i / chunk), i));
        bytes += 4.0 * chunk * c->size;
        free(full);
        free(own);
    }
    check_stat(c, COLL_ALLGATHER, NSIZES, bytes, where);
}

static void test_broadcast(comm *c, const char *where) {
    comm_reset_stats(c);
    double bytes = 0;
    for (int root = 0; root < c->size; root++)
        for (int s = 0; s < NSIZES; s++) {
            long n = sizes[s];
            float *b = floats(n, -1.0f);
            if (c->rank == root)
                for (long i = 0; i < n; i++) b[i] = val(root, i);
            comm_broadcast(c, b, n, COMM_VALUES, root);
            for (long i = 0; i < n; i++)
                CHECK(b[i] == val(root, i), "%s broadcast root %d n=%ld: [%ld] = %g, expected %g",
                      where, root, n, i, b[i], val(root, i));
            bytes += 4.0 * n;
            free(b);
        }
    check_stat(c, COLL_BROADCAST, (long)c->size * NSIZES, bytes, where);
}

/* ---- all-to-all ------------------------------------------------------------------- */

/* Element e of the block rank `from` sends to rank `to`: distinct for every
 * (from, to, e) and exact in a float (and, masked, as bf16 bits). */
static long a2a_val(int from, int to, long e) { return from * 100000L + to * 10000L + e; }

/* The count rank `from` sends to rank `to` in round k: uneven, zero often
 * (a whole row of zeros at some ranks and rounds). */
static long a2a_count(int from, int to, int k, long scale) { return (long)((from * 7 + to * 3 + k) % 5) * scale; }

static void put(void *buf, long i, long v) {
    if (g_precision == PREC_BF16) ((uint16_t *)buf)[i] = (uint16_t)(v & 0xFFFF);
    else ((float *)buf)[i] = (float)v;
}
static long get(const void *buf, long i) {
    return g_precision == PREC_BF16 ? (long)((const uint16_t *)buf)[i] : (long)((const float *)buf)[i];
}
static long expect_bits(long v) { return g_precision == PREC_BF16 ? (v & 0xFFFF) : v; }

static void *values(long n, long fill) {
    void *p = malloc((size_t)(n > 0 ? n : 1) * value_bytes());
    if (!p) fail("out of memory");
    for (long i = 0; i < n; i++) put(p, i, fill);
    return p;
}

static void test_alltoall(comm *c, const char *where) {
    const int r = c->rank, p = c->size;
    const long vb = (long)value_bytes();
    comm_reset_stats(c);
    double bytes = 0;
    long calls = 0;
    /* even blocks */
    for (int s = 0; s < NSIZES; s++) {
        long n = sizes[s] < 5000 ? sizes[s] : 5000;
        void *send = values(n * p, 0), *recv = values(n * p, -3);
        for (int j = 0; j < p; j++)
            for (long e = 0; e < n; e++) put(send, j * n + e, a2a_val(r, j, e));
        comm_alltoall(c, send, recv, n, COMM_VALUES);
        for (int j = 0; j < p; j++)
            for (long e = 0; e < n; e++)
                CHECK(get(recv, j * n + e) == expect_bits(a2a_val(j, r, e)),
                      "%s alltoall n=%ld: block %d [%ld] = %ld, expected %ld", where, n, j, e, get(recv, j * n + e),
                      expect_bits(a2a_val(j, r, e)));
        bytes += (double)(vb * n * p);
        calls++;
        free(send);
        free(recv);
    }
    /* uneven blocks, zeros included; packed (offsets NULL), then with offsets:
     * the send blocks stored in reverse rank order, the received ones with a
     * gap of 3 values before each, which must stay untouched */
    const long scales[] = {1, 37, 1000};
    for (int k = 0; k < 3 * 2; k++) {
        int with_offsets = k % 2;
        long scale = scales[k / 2];
        long *sc = malloc(sizeof(long) * 4 * (size_t)p), *so = sc + p, *rc = sc + 2 * p, *ro = sc + 3 * p;
        long send_n = 0, recv_n = 0;
        for (int j = p - 1; j >= 0; j--) { /* reverse order: block p-1 first */
            sc[j] = a2a_count(r, j, k, scale);
            so[j] = with_offsets ? send_n : -1;
            send_n += sc[j];
        }
        for (int j = 0; j < p; j++) {
            rc[j] = a2a_count(j, r, k, scale);
            if (with_offsets) recv_n += 3;
            ro[j] = recv_n;
            recv_n += rc[j];
        }
        if (!with_offsets) { /* packed in rank order */
            long o = 0;
            for (int j = 0; j < p; j++) { so[j] = o; o += sc[j]; }
        }
        void *send = values(send_n, 0), *recv = values(recv_n, -3);
        for (int j = 0; j < p; j++)
            for (long e = 0; e < sc[j]; e++) put(send, so[j] + e, a2a_val(r, j, e));
        comm_alltoallv(c, send, sc, with_offsets ? so : NULL, recv, rc, with_offsets ? ro : NULL, COMM_VALUES);
        for (int j = 0; j < p; j++) {
            for (long e = 0; e < rc[j]; e++)
                CHECK(get(recv, ro[j] + e) == expect_bits(a2a_val(j, r, e)),
                      "%s alltoallv round %d: from %d [%ld] = %ld, expected %ld", where, k, j, e,
                      get(recv, ro[j] + e), expect_bits(a2a_val(j, r, e)));
            if (with_offsets)
                for (long e = ro[j] - 3; e < ro[j]; e++)
                    CHECK(get(recv, e) == expect_bits(-3), "%s alltoallv round %d: the gap before block %d was written",
                          where, k, j);
        }
        bytes += (double)(vb * send_n);
        calls++;
        free(send);
        free(recv);
        free(sc);
    }
    check_stat(c, COLL_ALLTOALL, calls, bytes, where);
}

/* ---- point-to-point ------------------------------------------------------------- */

static void test_p2p(comm *c) {
    int r = c->rank, p = c->size;
    comm_reset_stats(c);
    double send_bytes = 0, recv_bytes = 0;
    long sends = 0, recvs = 0;

    /* A ring: everybody sends to r+1 and receives from r-1 at once. */
    for (int s = 0; s < NSIZES; s++) {
        long n = sizes[s];
        int dst = (r + 1) % p, src = (r - 1 + p) % p;
        float *out = floats(n, 0), *in = floats(n, -1.0f);
        for (long i = 0; i < n; i++) out[i] = val(r, i);
        comm_sendrecv(c, out, n, dst, in, n, src, COMM_VALUES);
        for (long i = 0; i < n; i++)
            CHECK(in[i] == val(src, i), "ring sendrecv n=%ld: [%ld] = %g, expected %g", n, i,
                  in[i], val(src, i));
        if (n > 0) { sends++; recvs++; send_bytes += 4.0 * n; recv_bytes += 4.0 * n; }
        free(out);
        free(in);
    }

    /* A chain, as a pipeline's forward pass: the first rank only sends, the last
     * only receives (dst / src < 0 switch a direction off). */
    {
        long n = 1000;
        int dst = r + 1 < p ? r + 1 : -1, src = r > 0 ? r - 1 : -1;
        float *out = floats(n, 0), *in = floats(n, -1.0f);
        for (long i = 0; i < n; i++) out[i] = val(r, i);
        comm_sendrecv(c, out, n, dst, in, n, src, COMM_VALUES);
        if (src >= 0)
            for (long i = 0; i < n; i++)
                CHECK(in[i] == val(src, i), "chain sendrecv: [%ld] = %g, expected %g", i, in[i],
                      val(src, i));
        else
            CHECK(in[0] == -1.0f, "chain sendrecv: rank 0 received although src < 0");
        if (dst >= 0) { sends++; send_bytes += 4.0 * n; }
        if (src >= 0) { recvs++; recv_bytes += 4.0 * n; }
        free(out);
        free(in);
    }

    /* Pairs with comm_send / comm_recv: even ranks send to r+1, then the reverse. */
    if (p >= 2) {
        for (int s = 0; s < NSIZES; s++) {
            long n = sizes[s];
            float *b = floats(n, -1.0f);
            int partner = r % 2 == 0 ? r + 1 : r - 1;
            if (partner < p) {
                for (int dir = 0; dir < 2; dir++) {
                    int sender = (r % 2 == 0) == (dir == 0);
                    if (sender) {
                        for (long i = 0; i < n; i++) b[i] = val(r, i) + dir;
                        comm_send(c, b, n, COMM_VALUES, partner);
                        sends++;
                        send_bytes += 4.0 * n;
                    } else {
                        for (long i = 0; i < n; i++) b[i] = -1.0f;
                        comm_recv(c, b, n, COMM_VALUES, partner);
                        for (long i = 0; i < n; i++)
                            CHECK(b[i] == val(partner, i) + dir,
                                  "send/recv n=%ld dir %d: [%ld] = %g, expected %g", n, dir, i,
                                  b[i], val(partner, i) + dir);
                        recvs++;
                        recv_bytes += 4.0 * n;
                    }
                }
            }
            free(b);
        }
    }
    check_stat(c, COLL_SEND, sends, send_bytes, "p2p");
    check_stat(c, COLL_RECV, recvs, recv_bytes, "p2p");

    comm_reset_stats(c);
    for (int i = 0; i < 3; i++) comm_barrier(c);
    check_stat(c, COLL_BARRIER, 3, 0, "barrier");
}

/* Nonblocking: every rank posts K receives from r-1 first, then K sends to
 * r+1 in the reverse tag order, interleaved with one blocking exchange the
 * other way round (tag 0 must not match them), then completes everything. */
static void test_nonblocking(comm *c) {
    enum { K = 4 };
    int r = c->rank, p = c->size, dst = (r + 1) % p, src = (r - 1 + p) % p;
    const long n = 4099; /* above MPICH's eager limit: the sends need the receiver */
    comm_reset_stats(c);
    comm_request recv[K] = {0}, send[K] = {0};
    float *in[K], *out[K];
    for (int k = 0; k < K; k++) {
        in[k] = floats(n, -1.0f);
        out[k] = floats(n, 0);
        for (long i = 0; i < n; i++) out[k][i] = val(r, i) + 0.5f * k;
    }
    comm_group_begin(c);
    for (int k = 0; k < K; k++) comm_irecv(c, in[k], n, COMM_VALUES, src, 1 + k, &recv[k]);
    comm_group_end(c);
    float *back = floats(n, -1.0f), *forth = floats(n, 0);
    for (long i = 0; i < n; i++) forth[i] = val(r, i) - 1;
    for (int k = K - 1; k >= 0; k--) {
        comm_isend(c, out[k], n, COMM_VALUES, dst, 1 + k, &send[k]);
        if (k == K / 2) comm_sendrecv(c, forth, n, src, back, n, dst, COMM_VALUES); /* the blocking one, reversed */
    }
    for (long i = 0; i < n; i++)
        CHECK(back[i] == val(dst, i) - 1, "nonblocking: the blocking exchange got [%ld] = %g", i, back[i]);
    for (int k = 0; k < K; k++) {
        comm_wait(&recv[k]);
        CHECK(comm_test(&recv[k]), "nonblocking: a completed receive must test complete");
        for (long i = 0; i < n; i++)
            if (in[k][i] != val(src, i) + 0.5f * k) {
                CHECK(0, "nonblocking tag %d: [%ld] = %g, expected %g", 1 + k, i, in[k][i], val(src, i) + 0.5f * k);
                break;
            }
    }
    for (int k = 0; k < K; k++) {
        while (!comm_test(&send[k])) {} /* the receiver has matched it: it completes */
        comm_request_free(&send[k]);
        comm_request_free(&recv[k]);
        free(in[k]);
        free(out[k]);
    }
    double bytes = 4.0 * n;
    check_stat(c, COLL_SEND, K + 1, (K + 1) * bytes, "nonblocking");
    check_stat(c, COLL_RECV, K + 1, (K + 1) * bytes, "nonblocking");
    free(back);
    free(forth);
}

/* ---- sub-groups ----------------------------------------------------------------- */

static void test_split(comm *world) {
    comm sub;
    comm_split(world, world->rank % 2, world->rank, &sub);
    int expect_size = (world->size + 1 - world->rank % 2) / 2;
    CHECK(sub.size == expect_size, "split: size %d, expected %d", sub.size, expect_size);
    CHECK(sub.rank == world->rank / 2, "split: rank %d, expected %d", sub.rank, world->rank / 2);
    CHECK(sub.backend == world->backend, "split: backend differs from the parent");
    const char *where = world->rank % 2 ? "odd group" : "even group";
    test_allreduce(&sub, where);
    test_reduce_scatter(&sub, 0, where);
    test_allgather(&sub, 0, where);
    test_broadcast(&sub, where);
    test_alltoall(&sub, where);
    /* The groups really are separate: a sum over the group, not the world. */
    float x = 1;
    comm_allreduce(&sub, &x, 1, COMM_FP32, 0);
    CHECK(x == (float)expect_size, "split: group sum %g, expected %d", x, expect_size);
    comm_free(&sub);

    /* MPI_Comm_split's order, which comm_split builds itself: by key, ties by parent rank; a negative color
     * (here the last rank's) leaves a rank out. Keys: the reverse order in pairs, so ranks 2k and 2k+1 tie. */
    const int left_out = world->size > 2 && world->rank == world->size - 1;
    comm_split(world, left_out ? -1 : 0, (world->size - 1 - world->rank) / 2, &sub);
    const int members = world->size > 2 ? world->size - 1 : world->size;
    if (left_out) CHECK(sub.rank == -1 && sub.size == 0, "split: a negative color gave rank %d size %d", sub.rank, sub.size);
    else {
        int before = 0; /* the members with a smaller key, or the same key and a smaller rank */
        for (int r = 0; r < members; r++) {
            const int kr = (world->size - 1 - r) / 2, kme = (world->size - 1 - world->rank) / 2;
            before += kr < kme || (kr == kme && r < world->rank);
        }
        CHECK(sub.size == members && sub.rank == before, "split by key: rank %d of %d, expected %d of %d", sub.rank,
              sub.size, before, members);
        int place = sub.rank, *got = malloc(sizeof(int) * (size_t)sub.size);
        MPI_Allgather(&place, 1, MPI_INT, got, 1, MPI_INT, sub.mpi);
        for (int i = 0; i < sub.size; i++) CHECK(got[i] == i, "split by key: place %d holds %d", i, got[i]);
        free(got);
    }
    comm_free(&sub);

    /* comm_group: the members in the order given, the same on each of them (here pairs, the higher rank first;
     * an odd world's last rank alone) */
    const int n = (world->rank | 1) < world->size ? 2 : 1;
    int pair[2] = {world->rank | 1, world->rank & ~1};
    if (n == 1) pair[0] = world->rank;
    comm_group(world, pair, n, &sub);
    const int place = n == 2 ? 1 - world->rank % 2 : 0;
    CHECK(sub.size == n && sub.rank == place, "group: rank %d of %d, expected %d of %d", sub.rank, sub.size, place, n);
    float y = (float)world->rank;
    comm_allreduce(&sub, &y, 1, COMM_FP32, 0);
    const float want = n == 2 ? (float)(2 * (world->rank & ~1) + 1) : (float)world->rank;
    CHECK(y == want, "group: sum %g, expected %g", y, want);
    comm_free(&sub);
}

/* ---- polite waiting --------------------------------------------------------------- */

static void test_polite_wait(comm *c) {
    if (c->size < 2) return;
    comm_barrier(c);
    double wall = 0, cpu = 0;
    if (c->rank == 0) {
        sleep_s(0.3);
        comm_barrier(c);
    } else {
        double w0 = now_seconds(), c0 = cpu_seconds();
        comm_barrier(c);
        wall = now_seconds() - w0;
        cpu = cpu_seconds() - c0;
    }
    double mine[2] = {wall, cpu}, all[8] = {0};
    MPI_Gather(mine, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, 0, c->mpi);
    if (c->rank == 0) {
        printf("polite wait (rank 0 sleeps 300 ms before a barrier):");
        for (int r = 1; r < c->size && r < 4; r++)
            printf("  rank %d waited %.1f ms using %.2f ms CPU (%.1f%%)", r, 1e3 * all[2 * r],
                   1e3 * all[2 * r + 1], 100 * all[2 * r + 1] / all[2 * r]);
        printf("\n");
    }
    if (c->rank == 0 && comm_waits_spin()) printf("(a core per rank: waits spin; PL_WAIT=polite tests the sleeping wait)\n");
    if (c->rank != 0) {
        CHECK(wall > 0.2, "polite wait: barrier returned after %.1f ms, before rank 0 arrived",
              1e3 * wall);
        CHECK(comm_waits_spin() || cpu < 0.3 * wall, "polite wait burns a core: %.1f ms CPU in %.1f ms of waiting",
              1e3 * cpu, 1e3 * wall);
    }

    /* Ping-pong latency between ranks 0 and 1 (reported, not asserted: timing on a
     * shared machine is noisy). */
    int rounds = 200;
    float x = 0;
    comm_barrier(c);
    double t0 = now_seconds();
    for (int i = 0; i < rounds && c->rank < 2; i++) {
        if (c->rank == 0) { comm_send(c, &x, 1, COMM_FP32, 1); comm_recv(c, &x, 1, COMM_FP32, 1); }
        else { comm_recv(c, &x, 1, COMM_FP32, 0); x += 1; comm_send(c, &x, 1, COMM_FP32, 0); }
    }
    double dt = now_seconds() - t0;
    if (c->rank == 0) {
        CHECK(x == (float)rounds, "ping-pong: counter %g, expected %d", x, rounds);
        printf("ping-pong latency (one way, 4 bytes): %.1f us\n", 1e6 * dt / (2.0 * rounds));
    }
}

/* ---- trace ------------------------------------------------------------------------ */

static long count_substr(const char *s, const char *needle) {
    long n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) fail("cannot read %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)len + 1);
    if (!s || fread(s, 1, (size_t)len, f) != (size_t)len) fail("cannot read %s", path);
    s[len] = 0;
    fclose(f);
    return s;
}

static void test_trace(comm *c) {
    comm_barrier(c);
    trace_reset();
    float buf[64] = {0};
    /* steps 0 and 1: compute, allreduce, barrier -> 3 events each */
    for (int step = 0; step < 2; step++) {
        trace_step_begin(step);
        int h = trace_begin("work", TRACE_COMPUTE, step, NULL);
        sleep_s(0.005);
        trace_end(h);
        comm_allreduce(c, buf, 64, COMM_VALUES, 0);
        comm_barrier(c);
        trace_step_end(step);
    }
    /* step 2: an outer compute event holding an inner one (40 ms of compute,
     * 60 ms if overlap were counted twice), then an allreduce -> 3 events */
    trace_step_begin(2);
    int outer = trace_begin("outer", TRACE_COMPUTE, -1, NULL);
    sleep_s(0.02);
    int inner = trace_begin("inner", TRACE_COMPUTE, -1, NULL);
    sleep_s(0.02);
    trace_end(inner);
    trace_end(outer);
    comm_allreduce(c, buf, 64, COMM_VALUES, 0);
    trace_step_end(2);
    const long per_rank = 9;

    trace_summary s1 = trace_summarize(1);
    CHECK(s1.steps == 2, "trace_summarize(1): %d steps, expected 2", s1.steps);
    CHECK(s1.comm > 0, "trace_summarize(1): comm = %g, expected > 0", s1.comm);
    CHECK(s1.compute >= 0.044, "trace_summarize(1): compute = %g, expected >= 0.044", s1.compute);
    CHECK(s1.compute + s1.comm <= s1.wall + 1e-6, "trace_summarize(1): compute %g + comm %g > wall %g",
          s1.compute, s1.comm, s1.wall);
    trace_summary s2 = trace_summarize(2);
    CHECK(s2.steps == 1, "trace_summarize(2): %d steps, expected 1", s2.steps);
    CHECK(s2.compute >= 0.039 && s2.compute <= s2.wall + 1e-6,
          "trace_summarize(2): compute %g (overlap merged?) vs wall %g", s2.compute, s2.wall);
    trace_summary s9 = trace_summarize(9);
    CHECK(s9.steps == 0 && s9.wall == 0 && s9.compute == 0 && s9.comm == 0,
          "trace_summarize past the last step is not empty");

    char dir[256] = "";
    if (c->rank == 0) {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/test_comm_XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(dir)) fail("mkdtemp(%s)", dir);
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, c->mpi);
    char json[300], csv[300];
    snprintf(json, sizeof json, "%s/trace.json", dir);
    snprintf(csv, sizeof csv, "%s/timeline.csv", dir);
    trace_write(c->mpi, json, csv);

    if (c->rank == 0) {
        char *text = read_file(csv);
        const char *header = "rank,start_us,end_us,op,kind,micro_batch,step\n";
        CHECK(strncmp(text, header, strlen(header)) == 0, "CSV header: %.60s", text);
        long lines = 0, per[4] = {0};
        char *save = NULL;
        for (char *line = strtok_r(text + strlen(header), "\n", &save); line;
             line = strtok_r(NULL, "\n", &save)) {
            int rank, mb, step;
            double t0, t1;
            char op[32], kind[16];
            int got = sscanf(line, "%d,%lf,%lf,%31[^,],%15[^,],%d,%d", &rank, &t0, &t1, op, kind,
                             &mb, &step);
            CHECK(got == 7, "CSV line does not parse: %s", line);
            CHECK(rank >= 0 && rank < c->size, "CSV rank %d", rank);
            CHECK(t0 >= 0 && t1 >= t0, "CSV times %g %g", t0, t1);
            CHECK(!strcmp(kind, "compute") || !strcmp(kind, "comm"), "CSV kind %s", kind);
            CHECK(step >= 0 && step <= 2, "CSV step %d", step);
            if (!strcmp(op, "work")) CHECK(mb == step, "CSV micro_batch %d of work step %d", mb, step);
            if (rank < 4) per[rank]++;
            lines++;
        }
        CHECK(lines == per_rank * c->size, "CSV has %ld events, expected %ld", lines,
              per_rank * c->size);
        for (int r = 0; r < c->size && r < 4; r++)
            CHECK(per[r] == per_rank, "CSV has %ld events of rank %d, expected %ld", per[r], r,
                  per_rank);
        free(text);

        text = read_file(json);
        CHECK(!strncmp(text, "{\"traceEvents\":[", 16), "JSON does not start with traceEvents");
        long complete = count_substr(text, "\"ph\":\"X\"");
        CHECK(complete == per_rank * c->size, "JSON has %ld complete events, expected %ld",
              complete, per_rank * c->size);
        CHECK(count_substr(text, "\"process_name\"") == c->size, "JSON process names");
        CHECK(count_substr(text, "\"thread_name\"") == 2L * c->size, "JSON thread names");
        CHECK(strstr(text, "\"name\":\"rank 0\"") && strstr(text, "\"name\":\"comm\""),
              "JSON metadata names");
        free(text);
        remove(json);
        remove(csv);
        rmdir(dir);
        printf("trace: %ld events, measured steps 1-2: wall %.1f ms, compute %.1f ms, comm %.2f ms\n",
               lines, 1e3 * s1.wall, 1e3 * s1.compute, 1e3 * s1.comm);
    }

    /* each second counted once: a blocking wait nested in a compute event (lab01's buckets on
     * the CPU) is comm, not compute too; `busy` (the pipeline's 1 - bubble) still holds it */
    trace_reset();
    trace_step_begin(0);
    int bwd = trace_begin("backward", TRACE_COMPUTE, -1, NULL);
    sleep_s(0.02);
    int wait = trace_begin("allreduce", TRACE_COMM, -1, NULL);
    sleep_s(0.02);
    trace_end(wait);
    trace_end(bwd);
    trace_step_end(0);
    trace_summary n = trace_summarize(0);
    /* each part slept 20 ms at least (a loaded machine adds to either, never takes away) */
    CHECK(n.comm >= 0.019 && n.compute >= 0.019, "nested comm: compute %g, comm %g (expected 0.02 or more each)",
          n.compute, n.comm);
    CHECK(n.compute + n.comm <= n.wall + 1e-6, "nested comm: compute %g + comm %g > wall %g", n.compute, n.comm, n.wall);
    CHECK(fabs(n.busy - (n.compute + n.comm)) < 1e-9, "nested comm: busy %g != compute %g + comm %g", n.busy,
          n.compute, n.comm);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    device_use(DEVICE_CPU, 0);
    trace_init(MPI_COMM_WORLD);

    comm world;
    comm_init(&world, MPI_COMM_WORLD, COMM_MPI);
    CHECK(world.rank == world_rank && world.size == world_size, "comm_init: rank/size");
    CHECK(world.mpi != MPI_COMM_WORLD, "comm_init did not duplicate the communicator");
    CHECK(comm_chunk(0, 3) == 0 && comm_chunk(7, 3) == 3 && comm_chunk(6, 3) == 2 &&
          comm_chunk(1, 4) == 1, "comm_chunk");

    test_allreduce(&world, "world");
    test_reduce_scatter(&world, 0, "world");
    test_reduce_scatter(&world, 1, "world");
    test_allgather(&world, 0, "world");
    test_allgather(&world, 1, "world");
    test_broadcast(&world, "world");
    test_alltoall(&world, "world");
    precision_use(PREC_BF16); /* 2-byte values: the same exchanges, bf16 bits */
    test_alltoall(&world, "world bf16");
    precision_use(PREC_FP32);
    test_p2p(&world);
    test_nonblocking(&world);
    test_split(&world);
    test_polite_wait(&world);
    test_trace(&world);

    comm_free(&world);
    if (world_rank == 0) printf("comm tests passed on %d ranks\n", world_size);
    MPI_Finalize();
    return 0;
}
