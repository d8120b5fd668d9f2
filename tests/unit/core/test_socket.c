/*
 * The socket helpers' connect: a socket connected to itself (TCP's simultaneous open, which a
 * retry can hit where nobody listens on a port of the ephemeral range) is told apart from a
 * connection to a listener, and a connect to a port nobody listens on ends in a timeout with
 * the text of a refused connection. (That connect_watch turns a self-connection into a
 * refusal is not forced here: a retry lands on its own port only by chance.)
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"

/* A socket bound to 127.0.0.1 on a port of the kernel's choice; *addr gets that address. */
static int bound_socket(hccl_sockaddr_t *addr)
{
    socklen_t len = sizeof(addr->in4);
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    assert_true(fd >= 0);
    memset(addr, 0, sizeof(*addr));
    addr->in4.sin_family = AF_INET;
    addr->in4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, &addr->sa, sizeof(addr->in4)), 0);
    assert_int_equal(getsockname(fd, &addr->sa, &len), 0);
    return fd;
}

static void test_self_connection_told_apart(void **state)
{
    hccl_sockaddr_t own, lsn_addr;
    int self = bound_socket(&own), lsn, fd;

    (void)state;
    /* Connected to its own address: the simultaneous open the retries can stumble on. */
    assert_int_equal(connect(self, &own.sa, sizeof(own.in4)), 0);
    assert_true(hccl_socket_connected_to_itself(self));
    close(self);

    lsn = bound_socket(&lsn_addr);
    assert_int_equal(listen(lsn, 1), 0);
    assert_int_equal(hccl_socket_connect_retry(&lsn_addr, hccl_now_ms() + 5000, &fd),
                     hcclSuccess);
    assert_false(hccl_socket_connected_to_itself(fd));
    close(fd);
    close(lsn);
}

/* Nobody listens (the port is bound, not listening, until the end): every attempt ends in
 * the connect timeout, with the text of a refused connection. */
static void test_nobody_listening_times_out(void **state)
{
    (void)state;
    for (int i = 0; i < 5; i++) {
        hccl_sockaddr_t addr;
        int fd = bound_socket(&addr), got = -1;
        assert_int_equal(hccl_socket_connect_retry(&addr, hccl_now_ms() + 200, &got),
                         hcclTimeout);
        assert_int_equal(got, -1);
        assert_non_null(strstr(hccl_error_last(), "nobody answered"));
        close(fd);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_self_connection_told_apart),
        cmocka_unit_test(test_nobody_listening_times_out),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
