/*
 * hcclCommSplit in one process, one thread per rank: colors form the groups,
 * keys (then old ranks) order them, HCCL_SPLIT_NOCOLOR gets NULL, and the new
 * communicators work and are independent of the parent.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "hccl.h"

#define N 5

typedef struct {
    hcclUniqueId id;
    int rank;
    hcclResult_t res;
    int new_rank;
    int new_size;
    int sum;        /* AllReduce of the old ranks inside the new communicator */
    int parent_sum; /* AllReduce on the parent afterwards */
} split_arg_t;

static void *split_rank(void *p)
{
    split_arg_t *a = p;
    hcclConfig_t cfg = HCCL_CONFIG_INITIALIZER;
    hcclComm_t comm, sub = NULL;
    /* Ranks 0, 2, 4 -> color 0; 1, 3 -> color 1; rank 4 opts out. Keys reverse the order. */
    int color = a->rank == 4 ? HCCL_SPLIT_NOCOLOR : a->rank % 2, key = -a->rank;

    cfg.connectTimeoutMs = 20000;
    a->res = hcclCommInitRankConfig(&comm, N, a->id, a->rank, &cfg);
    if (a->res != hcclSuccess)
        return NULL;
    a->res = hcclCommSplit(comm, color, key, &sub);
    if (a->res == hcclSuccess && sub) {
        a->sum = a->rank;
        hcclCommUserRank(sub, &a->new_rank);
        hcclCommCount(sub, &a->new_size);
        a->res = hcclAllReduce(&a->sum, &a->sum, 1, hcclInt32, hcclSum, sub);
    } else if (a->res == hcclSuccess) {
        a->new_rank = a->new_size = -1;
    }
    a->parent_sum = 1;
    if (a->res == hcclSuccess)
        a->res = hcclAllReduce(&a->parent_sum, &a->parent_sum, 1, hcclInt32, hcclSum, comm);
    if (sub)
        hcclCommDestroy(sub);
    hcclCommDestroy(comm);
    return NULL;
}

static void test_split(void **state)
{
    split_arg_t a[N];
    pthread_t th[N];
    hcclUniqueId id;

    (void)state;
    assert_int_equal(hcclGetUniqueId(&id), hcclSuccess);
    for (int r = 0; r < N; r++) {
        memset(&a[r], 0, sizeof(a[r]));
        a[r].id = id;
        a[r].rank = r;
        assert_int_equal(pthread_create(&th[r], NULL, split_rank, &a[r]), 0);
    }
    for (int r = 0; r < N; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < N; r++) {
        assert_int_equal(a[r].res, hcclSuccess);
        assert_int_equal(a[r].parent_sum, N);
    }
    /* color 0: ranks 0 and 2 with keys 0 and -2: rank 2 first. */
    assert_int_equal(a[2].new_rank, 0);
    assert_int_equal(a[0].new_rank, 1);
    assert_int_equal(a[0].new_size, 2);
    assert_int_equal(a[0].sum, 2);
    assert_int_equal(a[2].sum, 2);
    /* color 1: ranks 1 and 3, rank 3 first. */
    assert_int_equal(a[3].new_rank, 0);
    assert_int_equal(a[1].new_rank, 1);
    assert_int_equal(a[1].sum, 4);
    assert_int_equal(a[4].new_rank, -1); /* NOCOLOR: no communicator */
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_split)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
