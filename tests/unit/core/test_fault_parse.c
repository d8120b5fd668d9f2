/* HCCL_FAULT parsing: every form of the three kinds, and malformed specs ignored, not fatal. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "core/fault.h"

static void test_kill_at_step(void **state)
{
    hccl_fault_set_t set;

    (void)state;
    hccl_fault_parse("kill:rank=2,seq=5,step=3", &set);
    assert_int_equal(set.n, 1);
    assert_int_equal(set.f[0].kind, HCCL_FAULT_KILL);
    assert_int_equal(set.f[0].at, HCCL_FAULT_AT_STEP);
    assert_int_equal(set.f[0].rank, 2);
    assert_int_equal(set.f[0].seq, 5);
    assert_int_equal(set.f[0].step, 3);
    assert_false(set.f[0].fired);
}

static void test_optional_fields_default_to_any(void **state)
{
    hccl_fault_set_t set;

    (void)state;
    hccl_fault_parse("kill:rank=0", &set);
    assert_int_equal(set.n, 1);
    assert_int_equal(set.f[0].seq, -1);
    assert_int_equal(set.f[0].step, -1);
}

static void test_points_of_life(void **state)
{
    hccl_fault_set_t set;

    (void)state;
    hccl_fault_parse("kill:rank=1,at=init;kill:rank=1,at=idle,seq=4;kill:rank=3,at=destroy;"
                     "kill:rank=2,at=shrink",
                     &set);
    assert_int_equal(set.n, 4);
    assert_int_equal(set.f[0].at, HCCL_FAULT_AT_INIT);
    assert_int_equal(set.f[1].at, HCCL_FAULT_AT_IDLE);
    assert_int_equal(set.f[1].seq, 4);
    assert_int_equal(set.f[2].at, HCCL_FAULT_AT_DESTROY);
    assert_int_equal(set.f[2].rank, 3);
    assert_int_equal(set.f[3].at, HCCL_FAULT_AT_SHRINK);
}

static void test_close_and_delay(void **state)
{
    hccl_fault_set_t set;

    (void)state;
    hccl_fault_parse("close:rank=1,peer=2,seq=7;delay:rank=0,ms=1500", &set);
    assert_int_equal(set.n, 2);
    assert_int_equal(set.f[0].kind, HCCL_FAULT_CLOSE);
    assert_int_equal(set.f[0].peer, 2);
    assert_int_equal(set.f[0].seq, 7);
    assert_int_equal(set.f[1].kind, HCCL_FAULT_DELAY);
    assert_int_equal(set.f[1].ms, 1500);
    assert_int_equal(set.f[1].seq, -1);
}

/* Each bad fault is dropped with a warning; the good ones around it are kept. */
static void test_malformed_are_ignored(void **state)
{
    static const char *const bad[] = {
        "explode:rank=1",          /* unknown kind */
        "kill",                    /* no colon */
        "kill:seq=3",              /* no rank */
        "kill:rank=-1",            /* negative */
        "kill:rank=1x",            /* trailing junk */
        "kill:rank=1,when=now",    /* unknown key */
        "kill:rank=1,seq",         /* no value */
        "kill:rank=1,at=lunch",    /* unknown point */
        "kill:rank=1,at=init,seq=2", /* seq only with steps and idle */
        "close:rank=1",            /* no peer */
        "close:rank=1,peer=1",     /* itself */
        "close:rank=1,peer=2,at=idle",
        "delay:rank=1",            /* no ms */
        "kill:rank=99999999999",   /* out of range */
        "",
    };
    hccl_fault_set_t set;
    char spec[256];

    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        hccl_fault_parse(bad[i], &set);
        assert_int_equal(set.n, 0);
        snprintf(spec, sizeof(spec), "kill:rank=1;%s;delay:rank=2,ms=5", bad[i]);
        hccl_fault_parse(spec, &set);
        assert_int_equal(set.n, 2);
        assert_int_equal(set.f[1].kind, HCCL_FAULT_DELAY);
    }
    hccl_fault_parse(NULL, &set);
    assert_int_equal(set.n, 0);
    hccl_fault_parse(";;;", &set);
    assert_int_equal(set.n, 0);
}

static void test_too_many_faults(void **state)
{
    hccl_fault_set_t set;
    char spec[1024] = "";

    (void)state;
    for (int i = 0; i < HCCL_FAULT_MAX + 3; i++)
        snprintf(spec + strlen(spec), sizeof(spec) - strlen(spec), "delay:rank=%d,ms=1;", i);
    hccl_fault_parse(spec, &set);
    assert_int_equal(set.n, HCCL_FAULT_MAX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_at_step),
        cmocka_unit_test(test_optional_fields_default_to_any),
        cmocka_unit_test(test_points_of_life),
        cmocka_unit_test(test_close_and_delay),
        cmocka_unit_test(test_malformed_are_ignored),
        cmocka_unit_test(test_too_many_faults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
