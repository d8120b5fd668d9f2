/*
 * The API's small conversions: the unique id as hex text and back (round trip, short buffers,
 * NULLs, bad characters, wrong lengths, a wrong magic, an all-zero id), the version and the
 * error strings (one per result, all different; the last error starts empty on a new thread).
 * A watchdog alarm ends a stuck test.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "bootstrap_helpers.h"
#include "core/comm.h"
#include "hccl.h"

/* ---- 7: unique id text ---- */

static void test_unique_id_string(void **state)
{
    hcclUniqueId id, back, bad;
    hccl_id_t raw;
    char text[HCCL_UNIQUE_ID_STRLEN], text2[HCCL_UNIQUE_ID_STRLEN], mod[HCCL_UNIQUE_ID_STRLEN + 2];

    (void)state;
    assert_int_equal(get_id_bounded(&id, 1), hcclSuccess);
    assert_int_equal(hcclUniqueIdToString(&id, text, sizeof(text)), hcclSuccess);
    assert_int_equal(strlen(text), HCCL_UNIQUE_ID_STRLEN - 1);
    assert_int_equal(strspn(text, "0123456789abcdef"), HCCL_UNIQUE_ID_STRLEN - 1);
    memset(&back, 0xee, sizeof(back));
    assert_int_equal(hcclUniqueIdFromString(&back, text), hcclSuccess);
    assert_memory_equal(&back, &id, sizeof(id));
    assert_int_equal(hcclUniqueIdToString(&back, text2, sizeof(text2)), hcclSuccess);
    assert_string_equal(text, text2);

    /* A short buffer, NULLs. */
    assert_int_equal(hcclUniqueIdToString(&id, text2, 256), hcclInvalidArgument);
    assert_true(strlen(hcclGetLastError(NULL)) > 0);
    assert_int_equal(hcclUniqueIdToString(NULL, text2, sizeof(text2)), hcclInvalidArgument);
    assert_int_equal(hcclUniqueIdToString(&id, NULL, sizeof(text2)), hcclInvalidArgument);
    assert_int_equal(hcclUniqueIdFromString(NULL, text), hcclInvalidArgument);
    assert_int_equal(hcclUniqueIdFromString(&back, NULL), hcclInvalidArgument);

    /* Not hex; upper case is hex. */
    memcpy(mod, text, sizeof(text));
    mod[40] = 'g';
    assert_int_equal(hcclUniqueIdFromString(&back, mod), hcclInvalidArgument);
    memcpy(mod, text, sizeof(text));
    mod[41] = ' ';
    assert_int_equal(hcclUniqueIdFromString(&back, mod), hcclInvalidArgument);
    /* Wrong lengths. */
    memcpy(mod, text, sizeof(text));
    mod[HCCL_UNIQUE_ID_STRLEN - 2] = '\0';
    assert_int_equal(hcclUniqueIdFromString(&back, mod), hcclInvalidArgument);
    mod[HCCL_UNIQUE_ID_STRLEN - 3] = '\0';
    assert_int_equal(hcclUniqueIdFromString(&back, mod), hcclInvalidArgument);
    memcpy(mod, text, sizeof(text));
    mod[HCCL_UNIQUE_ID_STRLEN - 1] = '0';
    mod[HCCL_UNIQUE_ID_STRLEN] = '0';
    mod[HCCL_UNIQUE_ID_STRLEN + 1] = '\0';
    assert_int_equal(hcclUniqueIdFromString(&back, mod), hcclInvalidArgument);
    assert_int_equal(hcclUniqueIdFromString(&back, ""), hcclInvalidArgument);
    /* Right length, valid hex, wrong magic. */
    bad = id;
    memcpy(&raw, bad.internal, sizeof(raw));
    raw.magic ^= 0x01000000u;
    memcpy(bad.internal, &raw, sizeof(raw));
    assert_int_equal(hcclUniqueIdToString(&bad, mod, sizeof(mod)), hcclSuccess);
    memset(&back, 0, sizeof(back));
    assert_int_equal(hcclUniqueIdFromString(&back, mod), hcclInvalidArgument);
    assert_true(strlen(hcclGetLastError(NULL)) > 0);
    /* An all-zero id is not one either. */
    memset(&bad, 0, sizeof(bad));
    assert_int_equal(hcclUniqueIdToString(&bad, mod, sizeof(mod)), hcclSuccess);
    assert_int_equal(hcclUniqueIdFromString(&back, mod), hcclInvalidArgument);
}

/* ---- 9: versions and error strings ---- */

static void *fresh_thread(void *p)
{
    const char *e = hcclGetLastError(NULL);

    *(bool *)p = e != NULL && e[0] == '\0';
    return NULL;
}

static void test_version_and_errors(void **state)
{
    int v = -1;
    pthread_t th;
    bool fresh_empty = false;

    (void)state;
    assert_int_equal(hcclGetVersion(&v), hcclSuccess);
    assert_int_equal(v, HCCL_MAJOR * 10000 + HCCL_MINOR * 100 + HCCL_PATCH);
    assert_int_equal(v, HCCL_VERSION_CODE);
    assert_int_equal(hcclGetVersion(NULL), hcclInvalidArgument);
    assert_true(strlen(hcclGetLastError(NULL)) > 0);

    for (int a = 0; a < hcclNumResults; a++) {
        const char *sa = hcclGetErrorString((hcclResult_t)a);
        assert_non_null(sa);
        assert_true(strlen(sa) > 0);
        for (int b = 0; b < a; b++)
            assert_string_not_equal(sa, hcclGetErrorString((hcclResult_t)b));
    }
    assert_non_null(hcclGetErrorString(hcclNumResults));
    assert_non_null(hcclGetErrorString((hcclResult_t)-1));
    assert_non_null(hcclGetErrorString((hcclResult_t)12345));

    assert_int_equal(pthread_create(&th, NULL, fresh_thread, &fresh_empty), 0);
    pthread_join(th, NULL);
    assert_true(fresh_empty);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_version_and_errors, setup_watchdog, teardown_watchdog),
        cmocka_unit_test_setup_teardown(test_unique_id_string, setup_watchdog, teardown_watchdog),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
