/*
 * base/cause.c: the order in which every rank settles on one root cause, the pooling of the
 * ranks that saw a timeout, the checks of a cause from the wire, and the text every rank
 * renders.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "base/cause.h"

#define N 4

static void test_order(void **state)
{
    hccl_cause_t cur, lost, text, timeout, mismatch, bare;

    (void)state;
    memset(&cur, 0, sizeof(cur));
    hccl_cause_lost(&lost, 3, 0, N);
    hccl_cause_text(&text, hcclSystemError, 2, N, "out of memory");
    hccl_cause_timeout(&timeout, 5, "allreduce seq 5", 1000, 1, N);
    hccl_cause_text(&mismatch, hcclInvalidUsage, 1, N, "collective mismatch");
    hccl_cause_text(&bare, hcclRemoteError, 0, N, "peer failed");

    /* Whatever the order of arrival, the same cause wins. */
    assert_true(hccl_cause_merge(&cur, &bare));
    assert_true(hccl_cause_merge(&cur, &lost));
    assert_int_equal(cur.kind, HCCL_CAUSE_LOST);
    assert_true(hccl_cause_merge(&cur, &text));
    assert_true(hccl_cause_merge(&cur, &timeout));
    assert_true(hccl_cause_merge(&cur, &mismatch));
    assert_int_equal(cur.code, hcclInvalidUsage);
    assert_false(hccl_cause_merge(&cur, &lost));
    assert_false(hccl_cause_merge(&cur, &timeout));

    memset(&cur, 0, sizeof(cur));
    assert_true(hccl_cause_merge(&cur, &mismatch));
    assert_false(hccl_cause_merge(&cur, &timeout));
    assert_false(hccl_cause_merge(&cur, &bare));
    assert_int_equal(cur.origin, 1);

    /* Between two of a kind, the lower origin rank. */
    hccl_cause_text(&text, hcclInvalidUsage, 0, N, "collective mismatch");
    assert_true(hccl_cause_merge(&cur, &text));
    assert_int_equal(cur.origin, 0);
}

static void test_timeout_pool(void **state)
{
    hccl_cause_t a, b, c, earlier;
    char buf[512];

    (void)state;
    /* Ranks 0, 1 and 2 time out on seq 7; rank 3 never posted it. */
    hccl_cause_timeout(&a, 7, "allreduce seq 7", 2000, 0, N);
    hccl_cause_timeout(&b, 7, "allreduce seq 7", 2000, 2, N);
    hccl_cause_timeout(&c, 7, "allreduce seq 7", 2000, 1, N);
    assert_int_equal(a.origin, 1); /* so far, rank 1 is the first not seen */
    assert_true(hccl_cause_merge(&a, &b));
    assert_true(hccl_cause_merge(&a, &c));
    assert_false(hccl_cause_merge(&a, &c));
    assert_int_equal(a.origin, 3);
    hccl_cause_render(&a, buf, sizeof(buf));
    assert_string_equal(buf, "root cause at rank 3: rank 3 did not take part in allreduce seq 7 "
                             "within the exec timeout of 2000 ms (seen by ranks 0,1,2, which had "
                             "joined it)");
    /* An earlier collective's timeout goes first. */
    hccl_cause_timeout(&earlier, 6, "broadcast seq 6", 2000, 3, N);
    assert_true(hccl_cause_merge(&a, &earlier));
    assert_int_equal(a.seq, 6);
    /* Every rank had joined: no rank is named as missing. */
    for (int r = 0; r < N; r++)
        hccl_cause_see(&a, r);
    assert_int_equal(a.origin, 0);
    hccl_cause_render(&a, buf, sizeof(buf));
    assert_non_null(strstr(buf, "on any rank (every rank had joined it)"));
}

static void test_adopt_final(void **state)
{
    hccl_cause_t mine, theirs;

    (void)state;
    hccl_cause_timeout(&mine, 7, "allreduce seq 7", 2000, 0, N);
    hccl_cause_see(&mine, 3);
    hccl_cause_timeout(&theirs, 7, "allreduce seq 7", 2000, 1, N);
    hccl_cause_see(&theirs, 2);
    theirs.flags = HCCL_CAUSE_FINAL;
    /* A settled view is taken as it is, not pooled: the text stays the sender's. */
    hccl_cause_adopt_final(&mine, &theirs);
    assert_true(hccl_cause_seen(&mine, 1));
    assert_false(hccl_cause_seen(&mine, 0));
    /* Unless ours goes first. */
    hccl_cause_text(&mine, hcclInvalidUsage, 2, N, "collective mismatch");
    hccl_cause_adopt_final(&mine, &theirs);
    assert_int_equal(mine.code, hcclInvalidUsage);
}

static void test_accept(void **state)
{
    hccl_cause_t c;
    const char *why;

    (void)state;
    hccl_cause_text(&c, hcclInvalidUsage, 2, N, "collective mismatch");
    assert_true(hccl_cause_accept(&c, N, &why));
    assert_false(hccl_cause_accept(&c, N + 1, &why));
    assert_non_null(strstr(why, "rank count"));
    c.origin = N;
    assert_false(hccl_cause_accept(&c, N, &why));
    c.origin = 1;
    c.code = hcclSuccess;
    assert_false(hccl_cause_accept(&c, N, &why));
    c.code = hcclNumResults;
    assert_false(hccl_cause_accept(&c, N, &why));
    c.code = hcclTimeout;
    c.kind = 9;
    assert_false(hccl_cause_accept(&c, N, &why));
    c.kind = HCCL_CAUSE_TEXT;
    c.flags = 2;
    assert_false(hccl_cause_accept(&c, N, &why));
    c.flags = 0;
    /* An unterminated text and ranks past the count are cut, not trusted. */
    memset(c.text, 'x', sizeof(c.text));
    c.seen[0] = ~0ull;
    assert_true(hccl_cause_accept(&c, N, &why));
    assert_int_equal(strlen(c.text), sizeof(c.text) - 1);
    assert_true(hccl_cause_seen(&c, N - 1));
    assert_false(hccl_cause_seen(&c, N));
}

static void test_render(void **state)
{
    hccl_cause_t c;
    char buf[512];

    (void)state;
    hccl_cause_lost(&c, 3, 0, N);
    hccl_cause_render(&c, buf, sizeof(buf));
    assert_string_equal(buf, "root cause at rank 3: rank 3 went away without a goodbye (its "
                             "process died or its connections were cut)");
    hccl_cause_text(&c, hcclInvalidUsage, 0, N, "collective mismatch at seq 1");
    hccl_cause_render(&c, buf, sizeof(buf));
    assert_string_equal(buf, "root cause at rank 0: collective mismatch at seq 1");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order),       cmocka_unit_test(test_timeout_pool),
        cmocka_unit_test(test_adopt_final), cmocka_unit_test(test_accept),
        cmocka_unit_test(test_render),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
