/*
 * The plan cache: hits and misses, LRU eviction, and reference counts that keep an evicted plan
 * valid (and runnable) for whoever holds it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "links/link.h"
#include "plan_helpers.h"
#include "reactor/reactor.h"
#include "sched/sched.h"

static hccl_plan_key_t key_of(size_t count)
{
    hccl_plan_key_t k;

    memset(&k, 0, sizeof(k));
    k.coll = 1;
    k.algo = 2;
    k.count = count;
    k.dtype = hcclFloat32;
    k.op = hcclSum;
    k.root = -1;
    return k;
}

static hccl_plan_t *small_plan(void)
{
    hccl_plan_t *p = new_plan(0, 1);

    assert_int_equal(
        hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, 0), hccl_bref(HCCL_SLOT_SEND, 0), 4, NULL),
        hcclSuccess);
    assert_int_equal(hccl_plan_finalize(p, 4, 4), hcclSuccess);
    return p;
}

static void test_cache_hit_miss(void **state)
{
    hccl_plan_cache_t *c = NULL;
    hccl_plan_key_t k1 = key_of(100), k;
    hccl_plan_t *p = small_plan(), *got;

    (void)state;
    assert_int_equal(hccl_plan_cache_create(4, &c), hcclSuccess);
    assert_null(hccl_plan_cache_get(c, &k1));
    assert_int_equal(hccl_plan_cache_put(c, &k1, p), hcclSuccess);
    assert_int_equal(atomic_load(&p->refs), 2);
    got = hccl_plan_cache_get(c, &k1);
    assert_ptr_equal(got, p);
    assert_int_equal(atomic_load(&p->refs), 3);
    hccl_plan_release(got);
    /* Every field of the key counts. */
    k = k1;
    k.coll++;
    assert_null(hccl_plan_cache_get(c, &k));
    k = k1;
    k.algo++;
    assert_null(hccl_plan_cache_get(c, &k));
    k = k1;
    k.count++;
    assert_null(hccl_plan_cache_get(c, &k));
    k = k1;
    k.dtype++;
    assert_null(hccl_plan_cache_get(c, &k));
    k = k1;
    k.op++;
    assert_null(hccl_plan_cache_get(c, &k));
    k = k1;
    k.root++;
    assert_null(hccl_plan_cache_get(c, &k));
    assert_int_equal(atomic_load(&p->refs), 2);
    hccl_plan_release(p);
    hccl_plan_cache_destroy(c);
    hccl_plan_cache_destroy(NULL);
}

static void test_cache_lru_eviction(void **state)
{
    hccl_plan_cache_t *c = NULL;
    hccl_plan_key_t ka = key_of(1), kb = key_of(2), kc = key_of(3), kd = key_of(4);
    hccl_plan_t *pa = small_plan(), *pb = small_plan(), *pc = small_plan(), *pd = small_plan();
    hccl_plan_t *got;

    (void)state;
    assert_int_equal(hccl_plan_cache_create(2, &c), hcclSuccess);
    assert_int_equal(hccl_plan_cache_put(c, &ka, pa), hcclSuccess);
    assert_int_equal(hccl_plan_cache_put(c, &kb, pb), hcclSuccess);
    /* a is used after b: b is the least recently used. */
    got = hccl_plan_cache_get(c, &ka);
    assert_ptr_equal(got, pa);
    hccl_plan_release(got);
    assert_int_equal(hccl_plan_cache_put(c, &kc, pc), hcclSuccess);
    assert_null(hccl_plan_cache_get(c, &kb));
    assert_int_equal(atomic_load(&pb->refs), 1); /* the cache let go of b */
    got = hccl_plan_cache_get(c, &ka);
    assert_ptr_equal(got, pa);
    hccl_plan_release(got);
    got = hccl_plan_cache_get(c, &kc);
    assert_ptr_equal(got, pc);
    hccl_plan_release(got);
    /* Now a is the least recently used. */
    assert_int_equal(hccl_plan_cache_put(c, &kd, pd), hcclSuccess);
    assert_null(hccl_plan_cache_get(c, &ka));
    got = hccl_plan_cache_get(c, &kc);
    assert_ptr_equal(got, pc);
    hccl_plan_release(got);
    got = hccl_plan_cache_get(c, &kd);
    assert_ptr_equal(got, pd);
    hccl_plan_release(got);
    assert_int_equal(atomic_load(&pa->refs), 1);
    assert_int_equal(atomic_load(&pc->refs), 2);
    assert_int_equal(atomic_load(&pd->refs), 2);
    hccl_plan_release(pa);
    hccl_plan_release(pb);
    hccl_plan_release(pc);
    hccl_plan_release(pd);
    hccl_plan_cache_destroy(c); /* frees c and d */
}

static void test_cache_evicted_plan_stays_valid(void **state)
{
    hccl_plan_cache_t *c = NULL;
    hccl_plan_key_t ka = key_of(10), kb = key_of(20), kc = key_of(30);
    hccl_plan_t *p, *held;

    (void)state;
    assert_int_equal(hccl_plan_cache_create(2, &c), hcclSuccess);
    p = small_plan();
    assert_int_equal(hccl_plan_cache_put(c, &ka, p), hcclSuccess);
    hccl_plan_release(p); /* only the cache holds it now */
    held = hccl_plan_cache_get(c, &ka);
    assert_non_null(held);
    assert_int_equal(atomic_load(&held->refs), 2);
    p = small_plan();
    assert_int_equal(hccl_plan_cache_put(c, &kb, p), hcclSuccess);
    hccl_plan_release(p);
    p = small_plan();
    assert_int_equal(hccl_plan_cache_put(c, &kc, p), hcclSuccess); /* evicts a (the oldest) */
    hccl_plan_release(p);
    assert_null(hccl_plan_cache_get(c, &ka));
    /* The caller's reference keeps the plan alive: ASan reports any use after free here. */
    assert_int_equal(atomic_load(&held->refs), 1);
    assert_int_equal(held->nsteps, 1);
    assert_int_equal(held->steps[0].kind, HCCL_STEP_COPY);
    assert_true(held->final);

    /* It still runs. */
    {
        hccl_reactor_t *r = NULL;
        hccl_exec_t *ex = NULL;
        hccl_conn_t *conns[1] = {NULL};
        int32_t in = 0x1234567, out = 0;
        done_t d;
        memset(&d, 0, sizeof(d));
        assert_int_equal(hccl_reactor_create(NULL, -1, &r), hcclSuccess);
        assert_int_equal(hccl_exec_create(r, 0, 1, conns, &ex), hcclSuccess);
        assert_int_equal(hccl_exec_start(ex, held, 1, &in, &out, on_done, &d, NULL), hcclSuccess);
        hccl_plan_release(held); /* the run holds its own reference */
        assert_true(drive_until(r, &d.ndone, 1));
        assert_int_equal(d.res, hcclSuccess);
        assert_int_equal(out, in);
        hccl_exec_destroy(ex);
        hccl_reactor_destroy(r);
    }
    hccl_plan_cache_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cache_hit_miss),
        cmocka_unit_test(test_cache_lru_eviction),
        cmocka_unit_test(test_cache_evicted_plan_stays_valid),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
