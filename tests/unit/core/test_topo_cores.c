/*
 * Whether a rank shares a CPU (hccl_topo_cores_shared), which decides if a waiting thread
 * yields its core or polls without system calls: ranks pinned to one CPU each compete only
 * with ranks pinned to the same CPU; unpinned ranks compete when there are more of them on
 * the host than CPUs they may use; ranks of other hosts never count. And whether any rank of
 * the host does (hccl_topo_host_cores_shared), which every rank of the host must answer alike.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/comm.h"

typedef struct {
    struct hcclComm comm;
    hccl_card_t *cards;
    int *node_of;
} fake_t;

/* n ranks, this one is rank; host[r] is rank r's host index, cpu[r] its pinned_cpu field. */
static void fake_init(fake_t *f, int n, int rank, const int *host, const uint32_t *cpu)
{
    memset(f, 0, sizeof(*f));
    f->cards = calloc((size_t)n, sizeof(*f->cards));
    f->node_of = calloc((size_t)n, sizeof(*f->node_of));
    assert_non_null(f->cards);
    assert_non_null(f->node_of);
    f->comm.nranks = n;
    f->comm.rank = rank;
    f->comm.cards = f->cards;
    f->comm.node_of = f->node_of;
    for (int r = 0; r < n; r++) {
        f->node_of[r] = host ? host[r] : 0;
        f->cards[r].rank = (uint32_t)r;
        f->cards[r].pinned_cpu = cpu ? cpu[r] : 0;
        f->cards[r].cpus = cpu && cpu[r] ? 1 : (uint32_t)hccl_cpus_available(&(int){0});
    }
}

static bool fake_shared(fake_t *f)
{
    bool shared = hccl_topo_cores_shared(&f->comm);

    free(f->cards);
    free(f->node_of);
    return shared;
}

/* 3 ranks pinned to 2 CPUs: rank 1 has its CPU alone, but its host's ranks share. */
static void test_host_answer(void **state)
{
    static const uint32_t cpu[3] = {1, 2, 1};
    fake_t f;

    (void)state;
    for (int r = 0; r < 3; r++) {
        fake_init(&f, 3, r, NULL, cpu);
        assert_true(hccl_topo_host_cores_shared(&f.comm));
        assert_true(fake_shared(&f) == (r != 1));
    }
    /* On another host, the pair pinned to one CPU is not ours. */
    fake_init(&f, 3, 1, (const int[]){1, 0, 1}, cpu);
    assert_false(hccl_topo_host_cores_shared(&f.comm));
    assert_false(fake_shared(&f));
    /* Unpinned ranks: each card says how many CPUs its rank may use. */
    fake_init(&f, 2, 0, NULL, NULL);
    f.cards[1].cpus = 1;
    assert_true(hccl_topo_host_cores_shared(&f.comm));
    f.cards[1].cpus = 2;
    f.cards[0].cpus = 2;
    assert_false(hccl_topo_host_cores_shared(&f.comm));
    assert_false(fake_shared(&f));
}

static void test_pinned(void **state)
{
    static const uint32_t distinct[4] = {1, 2, 3, 4}, doubled[4] = {1, 2, 1, 2};
    fake_t f;

    (void)state;
    fake_init(&f, 4, 0, NULL, distinct);
    assert_false(fake_shared(&f));
    fake_init(&f, 4, 1, NULL, doubled); /* rank 3 is pinned to rank 1's CPU */
    assert_true(fake_shared(&f));
    /* The same CPU number on another host is another CPU. */
    fake_init(&f, 4, 1, (const int[]){0, 0, 1, 1}, doubled);
    assert_false(fake_shared(&f));
}

static void test_unpinned(void **state)
{
    int only_cpu, cpus = hccl_cpus_available(&only_cpu);
    int *hosts;
    fake_t f;

    (void)state;
    assert_true(cpus >= 1);
    hosts = calloc((size_t)cpus * 2, sizeof(*hosts));
    assert_non_null(hosts);
    fake_init(&f, cpus, 0, NULL, NULL);
    assert_false(fake_shared(&f));
    fake_init(&f, cpus + 1, 0, NULL, NULL);
    assert_true(fake_shared(&f));
    /* As many ranks again on a second host change nothing here. */
    for (int r = 0; r < 2 * cpus; r++)
        hosts[r] = r < cpus ? 0 : 1;
    fake_init(&f, 2 * cpus, 0, hosts, NULL);
    assert_false(fake_shared(&f));
    free(hosts);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pinned),
        cmocka_unit_test(test_unpinned),
        cmocka_unit_test(test_host_answer),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
