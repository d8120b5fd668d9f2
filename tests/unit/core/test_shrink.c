/*
 * hcclCommShrink: the argument checks, the renumbering, the agreement check and the hello's
 * decoder as pure functions; then whole shrinks in one process, one thread per rank: a
 * healthy communicator without a rank, without its leader (rank 0, who also was the
 * bootstrap's), a second shrink of the shrunk one, and survivors that disagree on the list.
 */
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/shrink.h"

/* ---- pure parts ---- */

static void test_list_check(void **state)
{
    int sorted[8], list[] = {5, 1, 3};

    (void)state;
    assert_int_equal(hccl_shrink_list_check(8, 0, list, 3, sorted), hcclSuccess);
    assert_int_equal(sorted[0], 1);
    assert_int_equal(sorted[1], 3);
    assert_int_equal(sorted[2], 5);
    assert_int_equal(hccl_shrink_list_check(8, 0, NULL, 0, sorted), hcclSuccess);
    assert_int_equal(hccl_shrink_list_check(8, 0, list, -1, sorted), hcclInvalidArgument);
    assert_int_equal(hccl_shrink_list_check(8, 0, NULL, 2, sorted), hcclInvalidArgument);
    assert_non_null(strstr(hcclGetLastError(NULL), "excludeRanks is NULL"));
    assert_int_equal(hccl_shrink_list_check(4, 0, list, 3, sorted), hcclInvalidArgument);
    assert_non_null(strstr(hcclGetLastError(NULL), "excludeRanks[0] is 5"));
    assert_int_equal(hccl_shrink_list_check(8, 0, (int[]){2, 4, 2}, 3, sorted),
                     hcclInvalidArgument);
    assert_non_null(strstr(hcclGetLastError(NULL), "rank 2 is listed twice"));
    assert_int_equal(hccl_shrink_list_check(8, 3, list, 3, sorted), hcclInvalidUsage);
    assert_non_null(strstr(hcclGetLastError(NULL), "rank 3 excludes itself"));
    /* More entries than ranks: refused before anything is copied into sorted (nranks long). */
    assert_int_equal(hccl_shrink_list_check(2, 0, (int[]){1, 1, 1}, 3, sorted),
                     hcclInvalidArgument);
    assert_non_null(strstr(hcclGetLastError(NULL), "excludeCount 3 exceeds"));
}

static void test_renumber(void **state)
{
    int new_of[8], sorted[] = {0, 3, 7};

    (void)state;
    assert_int_equal(hccl_shrink_renumber(8, sorted, 3, new_of), 5);
    int want[8] = {-1, 0, 1, -1, 2, 3, 4, -1};
    assert_memory_equal(new_of, want, sizeof(want));
    assert_int_equal(hccl_shrink_renumber(3, NULL, 0, new_of), 3);
    assert_int_equal(new_of[2], 2);
}

static void test_agree(void **state)
{
    char why[256], text[12];

    (void)state;
    assert_int_equal(hccl_shrink_agree(0, (int[]){3}, 1, 2, (int[]){3}, 1, why, sizeof(why)),
                     hcclSuccess);
    assert_int_equal(hccl_shrink_agree(0, NULL, 0, 2, NULL, 0, why, sizeof(why)), hcclSuccess);
    assert_int_equal(hccl_shrink_agree(0, (int[]){3}, 1, 2, (int[]){1, 3}, 2, why, sizeof(why)),
                     hcclInvalidUsage);
    assert_non_null(strstr(why, "rank 0 excludes 3, rank 2 excludes 1,3"));
    assert_int_equal(hccl_shrink_agree(0, (int[]){1, 3}, 2, 1, (int[]){3}, 1, why, sizeof(why)),
                     hcclInvalidUsage);
    assert_non_null(strstr(why, "rank 1 takes part although rank 0 excludes it"));
    assert_int_equal(hccl_shrink_agree(1, (int[]){0}, 1, 2, NULL, 0, why, sizeof(why)),
                     hcclInvalidUsage);
    assert_non_null(strstr(why, "rank 1 excludes 0, rank 2 excludes none"));
    hccl_shrink_list_text((int[]){100, 200, 300}, 3, text, sizeof(text));
    assert_string_equal(text, "100,200...");
}

static void test_hello_check(void **state)
{
    uint8_t secret[HCCL_SECRET_BYTES] = {1, 2, 3};
    hccl_shrink_hello_t h, bad;

    (void)state;
    memset(&h, 0, sizeof(h));
    h.magic = HCCL_SHRINK_HELLO_MAGIC;
    h.version = HCCL_SHRINK_VERSION;
    memcpy(h.secret, secret, sizeof(secret));
    h.comm_id = 42;
    h.rank = 2;
    h.nranks = 4;
    h.nexclude = 1;
    strcpy(h.config, "HCCL_ALGO=\n");
    strcpy(h.card.host, "a");
    bad = h;
    assert_null(hccl_shrink_hello_check(&bad, 42, secret, 4));
    bad = h;
    bad.secret[0] = 9;
    assert_non_null(hccl_shrink_hello_check(&bad, 42, secret, 4));
    bad = h;
    assert_non_null(hccl_shrink_hello_check(&bad, 43, secret, 4));
    bad = h;
    bad.rank = 4;
    assert_non_null(hccl_shrink_hello_check(&bad, 42, secret, 4));
    bad = h;
    bad.nexclude = 4;
    assert_non_null(hccl_shrink_hello_check(&bad, 42, secret, 4));
    bad = h;
    bad.status = hcclInProgress;
    assert_non_null(hccl_shrink_hello_check(&bad, 42, secret, 4));
    bad = h;
    memset(bad.config, 'x', sizeof(bad.config));
    assert_non_null(hccl_shrink_hello_check(&bad, 42, secret, 4));
    assert_true(hccl_shrink_list_valid((int32_t[]){0, 2}, 2, 4));
    assert_false(hccl_shrink_list_valid((int32_t[]){2, 2}, 2, 4));
    assert_false(hccl_shrink_list_valid((int32_t[]){2, 1}, 2, 4));
    assert_false(hccl_shrink_list_valid((int32_t[]){4}, 1, 4));
}

/* ---- whole shrinks, one thread per rank ---- */

#define N 5
#define MAXEX 3

typedef struct {
    hcclUniqueId id;
    int rank;
    int excl[MAXEX], nexcl;   /* first shrink; a rank that is in its own list leaves instead */
    int excl2[MAXEX], nexcl2; /* second shrink of the new one (nexcl2 < 0: none) */
    hcclResult_t res, res2;
    char err[512];
    int new_rank, new_size, sum;
    int new_rank2, new_size2, sum2;
} rank_arg_t;

static bool listed(const int *l, int n, int r)
{
    for (int i = 0; i < n; i++)
        if (l[i] == r)
            return true;
    return false;
}

/* The new communicator works: AllReduce of the parent ranks; its size and our rank in it. */
static hcclResult_t check_comm(hcclComm_t c, int parent_rank, int *rank, int *size, int *sum)
{
    hcclCommUserRank(c, rank);
    hcclCommCount(c, size);
    *sum = parent_rank;
    return hcclAllReduce(sum, sum, 1, hcclInt32, hcclSum, c);
}

static void *shrink_rank(void *p)
{
    rank_arg_t *a = p;
    hcclConfig_t cfg = HCCL_CONFIG_INITIALIZER;
    hcclComm_t comm, sub = NULL, sub2 = NULL;

    cfg.connectTimeoutMs = 20000;
    a->res = hcclCommInitRankConfig(&comm, N, a->id, a->rank, &cfg);
    if (a->res != hcclSuccess)
        return NULL;
    if (listed(a->excl, a->nexcl, a->rank)) {
        a->new_rank = -1;
        hcclCommDestroy(comm);
        return NULL;
    }
    a->res = hcclCommShrink(comm, a->excl, a->nexcl, NULL, &sub);
    if (a->res != hcclSuccess) {
        snprintf(a->err, sizeof(a->err), "%s", hcclGetLastError(NULL));
        hcclCommAbort(comm);
        return NULL;
    }
    a->res = check_comm(sub, a->rank, &a->new_rank, &a->new_size, &a->sum);
    if (a->res == hcclSuccess && a->nexcl2 >= 0 && !listed(a->excl2, a->nexcl2, a->new_rank)) {
        a->res2 = hcclCommShrink(sub, a->excl2, a->nexcl2, NULL, &sub2);
        if (a->res2 == hcclSuccess)
            a->res2 = check_comm(sub2, a->rank, &a->new_rank2, &a->new_size2, &a->sum2);
        if (sub2)
            hcclCommDestroy(sub2);
    }
    hcclCommDestroy(sub);
    hcclCommDestroy(comm);
    return NULL;
}

/* Runs N ranks; lists[r] is rank r's first list (NULL: all take excl), excl2 for the second. */
static void run(rank_arg_t *a, const int *excl, int nexcl, const int *excl2, int nexcl2)
{
    pthread_t th[N];
    hcclUniqueId id;

    assert_int_equal(hcclGetUniqueId(&id), hcclSuccess);
    for (int r = 0; r < N; r++) {
        memset(&a[r], 0, sizeof(a[r]));
        a[r].id = id;
        a[r].rank = r;
        memcpy(a[r].excl, excl, (size_t)nexcl * sizeof(int));
        a[r].nexcl = nexcl;
        if (nexcl2 > 0)
            memcpy(a[r].excl2, excl2, (size_t)nexcl2 * sizeof(int));
        a[r].nexcl2 = nexcl2;
    }
    for (int r = 0; r < N; r++)
        assert_int_equal(pthread_create(&th[r], NULL, shrink_rank, &a[r]), 0);
    for (int r = 0; r < N; r++)
        pthread_join(th[r], NULL);
}

static void test_shrink_healthy(void **state)
{
    rank_arg_t a[N];

    (void)state;
    /* Without ranks 1 and 3: 0, 2, 4 become 0, 1, 2. Then the new rank 0 (old 0) leaves too. */
    run(a, (int[]){3, 1}, 2, (int[]){0}, 1);
    for (int r = 0; r < N; r++) {
        assert_int_equal(a[r].res, hcclSuccess);
        if (r == 1 || r == 3)
            continue;
        assert_int_equal(a[r].new_rank, r / 2);
        assert_int_equal(a[r].new_size, 3);
        assert_int_equal(a[r].sum, 0 + 2 + 4);
    }
    for (int r = 2; r < N; r += 2) {
        assert_int_equal(a[r].res2, hcclSuccess);
        assert_int_equal(a[r].new_rank2, r / 2 - 1);
        assert_int_equal(a[r].new_size2, 2);
        assert_int_equal(a[r].sum2, 2 + 4);
    }
}

static void test_shrink_without_rank0(void **state)
{
    rank_arg_t a[N];

    (void)state;
    run(a, (int[]){0}, 1, NULL, -1);
    for (int r = 1; r < N; r++) {
        assert_int_equal(a[r].res, hcclSuccess);
        assert_int_equal(a[r].new_rank, r - 1);
        assert_int_equal(a[r].sum, 1 + 2 + 3 + 4);
    }
}

/* Rank 4 leaves; ranks 0 to 3 exclude 4, but rank 3 passes odd[nodd]: all four must get
 * hcclInvalidUsage with want in the text. */
static void run_disagree(const int *odd, int nodd, const char *want)
{
    rank_arg_t a[N];
    pthread_t th[N];
    hcclUniqueId id;
    struct stat before, after;

    /* A failed shrink closes no descriptor it does not own: fd 0 stands for the program's (a
     * failed join once took it for the rendezvous' set-up connection and closed it). */
    assert_int_equal(fstat(0, &before), 0);
    assert_int_equal(hcclGetUniqueId(&id), hcclSuccess);
    for (int r = 0; r < N; r++) {
        memset(&a[r], 0, sizeof(a[r]));
        a[r].id = id;
        a[r].rank = r;
        a[r].nexcl = r == 3 ? nodd : 1;
        if (r == 3)
            memcpy(a[r].excl, odd, (size_t)nodd * sizeof(int));
        else
            a[r].excl[0] = 4;
        a[r].nexcl2 = -1;
    }
    for (int r = 0; r < N; r++)
        assert_int_equal(pthread_create(&th[r], NULL, shrink_rank, &a[r]), 0);
    for (int r = 0; r < N; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < 4; r++) {
        assert_int_equal(a[r].res, hcclInvalidUsage);
        assert_non_null(strstr(a[r].err, want));
    }
    assert_int_equal(fstat(0, &after), 0);
    assert_true(after.st_dev == before.st_dev && after.st_ino == before.st_ino);
}

static void test_shrink_disagree(void **state)
{
    (void)state;
    /* Rank 3 also excludes rank 2, which stays: the leader (rank 0) sees it in rank 3's hello. */
    run_disagree((int[]){2, 4}, 2, "rank 0 excludes 4, rank 3 excludes 2,4");
}

static void test_shrink_disagree_on_leader(void **state)
{
    (void)state;
    /* Rank 3 also excludes rank 0, so takes rank 1 for the leader, which tells it and rank 0. */
    run_disagree((int[]){0, 4}, 2, "rank 1 excludes 4, rank 3 excludes 0,4");
}

/* The checks at the boundary, on a communicator of one rank; it shrinks by nothing to one. */
static void test_shrink_one_rank(void **state)
{
    hcclComm_t c, sub = NULL;
    hcclConfig_t bad = HCCL_CONFIG_INITIALIZER;
    hcclUniqueId id;
    int x = 7, n = 0;

    (void)state;
    assert_int_equal(hcclCommShrink(NULL, NULL, 0, NULL, &sub), hcclInvalidArgument);
    assert_int_equal(hcclGetUniqueId(&id), hcclSuccess);
    assert_int_equal(hcclCommInitRank(&c, 1, id, 0), hcclSuccess);
    assert_int_equal(hcclCommShrink(c, NULL, 0, NULL, NULL), hcclInvalidArgument);
    assert_int_equal(hcclCommShrink(c, (int[]){0}, 1, NULL, &sub), hcclInvalidUsage);
    assert_int_equal(hcclCommShrink(c, (int[]){1}, 1, NULL, &sub), hcclInvalidArgument);
    bad.size = 1;
    assert_int_equal(hcclCommShrink(c, NULL, 0, &bad, &sub), hcclInvalidUsage);
    assert_null(sub);
    assert_int_equal(hcclCommShrink(c, NULL, 0, NULL, &sub), hcclSuccess);
    assert_int_equal(hcclCommCount(sub, &n), hcclSuccess);
    assert_int_equal(n, 1);
    assert_int_equal(hcclAllReduce(&x, &x, 1, hcclInt32, hcclSum, sub), hcclSuccess);
    assert_int_equal(x, 7);
    assert_int_equal(hcclCommDestroy(sub), hcclSuccess);
    assert_int_equal(hcclCommDestroy(c), hcclSuccess);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list_check),
        cmocka_unit_test(test_renumber),
        cmocka_unit_test(test_agree),
        cmocka_unit_test(test_hello_check),
        cmocka_unit_test(test_shrink_one_rank),
        cmocka_unit_test(test_shrink_healthy),
        cmocka_unit_test(test_shrink_without_rank0),
        cmocka_unit_test(test_shrink_disagree),
        cmocka_unit_test(test_shrink_disagree_on_leader),
    };
    /* fd 0 open, whatever the runner gave us (run_disagree watches it). */
    if (fcntl(0, F_GETFD) < 0 && open("/dev/null", O_RDONLY) != 0)
        return 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
