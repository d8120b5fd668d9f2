/*
 * Multi-process check of every collective but AllReduce (mp_allreduce has
 * that), run through hccl-run at several rank counts and links: Broadcast and
 * Reduce from several roots, AllGather and ReduceScatter in and out of place,
 * AlltoAll, AlltoAllv with uneven counts and gaps, Barrier, and Send/Recv
 * (a ring exchange, and to oneself), at sizes that select every algorithm.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hccl.h"
#include "mp_check.h"

static int g_rank = -1, g_n = 0, g_bad = 0;

#define EXPECT(cond, ...)                                                                \
    do {                                                                                 \
        if (!(cond) && g_bad++ < 10) {                                                   \
            fprintf(stderr, "rank %d: ", g_rank);                                        \
            fprintf(stderr, __VA_ARGS__);                                                \
            fputc('\n', stderr);                                                         \
        }                                                                                \
    } while (0)

/* The value rank r contributes at element i: distinct per rank and element, exact in int32. */
static int32_t val(int r, size_t i)
{
    return (int32_t)((i * 7919u + (size_t)r * 104729u) % 100003u) - 50000;
}

static int32_t *ibuf(size_t n)
{
    int32_t *p = calloc(n + 1, sizeof(int32_t));

    if (!p) {
        fprintf(stderr, "rank %d: out of memory\n", g_rank);
        exit(1);
    }
    return p;
}

static void test_broadcast(hcclComm_t comm, size_t count, int root)
{
    int32_t *b = ibuf(count);

    for (size_t i = 0; i < count; i++)
        b[i] = g_rank == root ? val(root, i) : -1;
    CHECK(hcclBroadcast(b, count, hcclInt32, root, comm));
    for (size_t i = 0; i < count; i++)
        EXPECT(b[i] == val(root, i), "broadcast %zu root %d: [%zu] = %d, want %d", count, root, i, b[i],
               val(root, i));
    free(b);
}

static void test_reduce(hcclComm_t comm, size_t count, int root, int in_place)
{
    int32_t *s = ibuf(count), *r = in_place ? s : ibuf(count);

    for (size_t i = 0; i < count; i++) {
        s[i] = val(g_rank, i);
        if (!in_place)
            r[i] = 12345;
    }
    CHECK(hcclReduce(s, r, count, hcclInt32, hcclSum, root, comm));
    for (size_t i = 0; i < count; i++) {
        int32_t want = 0;
        for (int k = 0; k < g_n; k++)
            want += val(k, i);
        if (g_rank == root)
            EXPECT(r[i] == want, "reduce %zu root %d: [%zu] = %d, want %d", count, root, i, r[i], want);
        else if (!in_place)
            EXPECT(r[i] == 12345, "reduce %zu root %d: non-root recvbuf touched", count, root);
        else
            EXPECT(s[i] == val(g_rank, i), "reduce %zu root %d: non-root sendbuf changed", count, root);
    }
    free(s);
    if (!in_place)
        free(r);
}

static void test_allgather(hcclComm_t comm, size_t count, int in_place)
{
    int32_t *r = ibuf(count * (size_t)g_n), *s = in_place ? r + (size_t)g_rank * count : ibuf(count);

    for (size_t i = 0; i < count; i++)
        s[i] = val(g_rank, i);
    CHECK(hcclAllGather(s, r, count, hcclInt32, comm));
    for (int k = 0; k < g_n; k++)
        for (size_t i = 0; i < count; i++)
            EXPECT(r[(size_t)k * count + i] == val(k, i), "allgather %zu%s: block %d [%zu] wrong", count,
                   in_place ? " in-place" : "", k, i);
    if (!in_place)
        free(s);
    free(r);
}

static void test_reducescatter(hcclComm_t comm, size_t count, int in_place)
{
    size_t total = count * (size_t)g_n;
    int32_t *s = ibuf(total), *r = in_place ? s + (size_t)g_rank * count : ibuf(count);

    for (size_t i = 0; i < total; i++)
        s[i] = val(g_rank, i);
    CHECK(hcclReduceScatter(s, r, count, hcclInt32, hcclMax, comm));
    for (size_t i = 0; i < count; i++) {
        size_t gi = (size_t)g_rank * count + i;
        int32_t want = val(0, gi);
        for (int k = 1; k < g_n; k++)
            want = val(k, gi) > want ? val(k, gi) : want;
        EXPECT(r[i] == want, "reducescatter %zu%s: [%zu] = %d, want %d", count, in_place ? " in-place" : "",
               i, r[i], want);
    }
    if (!in_place)
        free(r);
    free(s);
}

static void test_alltoall(hcclComm_t comm, size_t count)
{
    size_t total = count * (size_t)g_n;
    int32_t *s = ibuf(total), *r = ibuf(total);

    /* Block j of rank k carries val(k, j*count + i). */
    for (size_t i = 0; i < total; i++)
        s[i] = val(g_rank, i);
    CHECK(hcclAlltoAll(s, r, count, hcclInt32, comm));
    for (int k = 0; k < g_n; k++)
        for (size_t i = 0; i < count; i++)
            EXPECT(r[(size_t)k * count + i] == val(k, (size_t)g_rank * count + i),
                   "alltoall %zu: block from %d [%zu] wrong", count, k, i);
    free(s);
    free(r);
}

/* Rank a sends (a + b) % 5 * scale elements to rank b; the blocks sit with a one-element gap. */
static size_t vcount(int a, int b, size_t scale)
{
    return (size_t)((a + b) % 5) * scale;
}

static void test_alltoallv(hcclComm_t comm, size_t scale)
{
    size_t n = (size_t)g_n, sc[64], sd[64], rc[64], rd[64], so = 0, ro = 0;
    int32_t *s, *r;

    for (size_t j = 0; j < n; j++) {
        sc[j] = vcount(g_rank, (int)j, scale);
        sd[j] = so;
        so += sc[j] + 1;
        rc[j] = vcount((int)j, g_rank, scale);
        rd[j] = ro;
        ro += rc[j] + 1;
    }
    s = ibuf(so);
    r = ibuf(ro);
    for (size_t i = 0; i < ro; i++)
        r[i] = -7;
    for (size_t j = 0; j < n; j++)
        for (size_t i = 0; i < sc[j]; i++)
            s[sd[j] + i] = val(g_rank, j * 1000 + i);
    CHECK(hcclAlltoAllv(s, sc, sd, r, rc, rd, hcclInt32, comm));
    for (size_t j = 0; j < n; j++) {
        for (size_t i = 0; i < rc[j]; i++)
            EXPECT(r[rd[j] + i] == val((int)j, (size_t)g_rank * 1000 + i), "alltoallv: from %zu [%zu] wrong",
                   j, i);
        EXPECT(r[rd[j] + rc[j]] == -7, "alltoallv: gap after the block from %zu was written", j);
    }
    free(s);
    free(r);
}

static void test_p2p(hcclComm_t comm, size_t count)
{
    int next = (g_rank + 1) % g_n, prev = (g_rank + g_n - 1) % g_n;
    int32_t *s = ibuf(count), *r = ibuf(count), *self = ibuf(count);
    hcclRequest_t reqs[4];

    for (size_t i = 0; i < count; i++)
        s[i] = val(g_rank, i);
    /* Receives first on every rank: nothing relies on buffering. Two messages each way, in order. */
    CHECK(hcclRecvAsync(r, count, hcclInt32, prev, comm, &reqs[0]));
    CHECK(hcclRecvAsync(self, count, hcclInt32, g_rank, comm, &reqs[1]));
    CHECK(hcclSendAsync(s, count, hcclInt32, next, comm, &reqs[2]));
    CHECK(hcclSendAsync(s, count, hcclInt32, g_rank, comm, &reqs[3]));
    CHECK(hcclWaitAll(4, reqs));
    for (size_t i = 0; i < count; i++) {
        EXPECT(r[i] == val(prev, i), "p2p %zu: from %d [%zu] wrong", count, prev, i);
        EXPECT(self[i] == val(g_rank, i), "p2p %zu: to itself [%zu] wrong", count, i);
    }
    free(s);
    free(r);
    free(self);
}

int main(int argc, char **argv)
{
    static const size_t sizes[] = {0, 1, 7, 1000, 50000, 1u << 20};
    size_t max = argc > 1 ? strtoull(argv[1], NULL, 0) : (1u << 20);
    hcclComm_t comm;

    CHECK(hcclCommInitFromEnv(&comm));
    CHECK(hcclCommUserRank(comm, &g_rank));
    CHECK(hcclCommCount(comm, &g_n));
    if (g_n > 64) {
        fprintf(stderr, "at most 64 ranks\n");
        return 2;
    }
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]) && sizes[k] <= max; k++) {
        size_t c = sizes[k];
        test_broadcast(comm, c, 0);
        test_broadcast(comm, c, g_n - 1);
        test_reduce(comm, c, g_n / 2, 0);
        test_reduce(comm, c, 0, 1);
        test_allgather(comm, c, 0);
        test_allgather(comm, c, 1);
        test_reducescatter(comm, c, 0);
        test_reducescatter(comm, c, 1);
        test_alltoall(comm, c);
        test_p2p(comm, c);
        CHECK(hcclBarrier(comm));
    }
    test_alltoallv(comm, 1);
    test_alltoallv(comm, 3000);
    CHECK(hcclBarrier(comm));
    CHECK(hcclCommDestroy(comm));
    printf("rank %d: %s\n", g_rank, g_bad ? "FAILED" : "all collectives checked");
    return g_bad ? 1 : 0;
}
