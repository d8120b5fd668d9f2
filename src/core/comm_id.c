/* Unique ids: creation, and their text form. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/comm_impl.h"
#include "core/fault.h"
#include "base/quarantine.h"
#include "core/wire.h"

hcclResult_t hccl_comm_id_check(const hccl_id_t *id, const char *fn)
{
    if (id->magic != HCCL_ID_MAGIC || id->version != HCCL_ID_VERSION)
        return HCCL_FAIL(hcclInvalidArgument,
                         "%s: the unique id is not one made by hcclGetUniqueId", fn);
    return hcclSuccess;
}

HCCL_API hcclResult_t hcclGetUniqueId(hcclUniqueId *uid)
{
    hccl_id_t id;
    hccl_params_t p;
    hccl_sockaddr_t addr;
    int fd;
    hcclResult_t res;

    _Static_assert(sizeof(hccl_id_t) <= sizeof(hcclUniqueId), "id does not fit");
    if (!uid)
        return HCCL_FAIL(hcclInvalidArgument, "hcclGetUniqueId: id is NULL");
    HCCL_CHECK(hccl_params_load(&p, NULL));
    memset(&id, 0, sizeof(id));
    id.magic = HCCL_ID_MAGIC;
    id.version = HCCL_ID_VERSION;
    HCCL_CHECK(hccl_random_bytes(id.secret, sizeof(id.secret)));
    HCCL_CHECK(hccl_socket_pick_addr(p.ifname, &addr));
    HCCL_CHECK(hccl_bootstrap_root_listen(&addr, &fd));
    hccl_id_from_addr(&id, &addr);
    res = hccl_bootstrap_root_start(&id, 0, p.connect_timeout_ms, &fd, NULL);
    if (res != hcclSuccess) {
        close(fd);
        return res;
    }
    memset(uid, 0, sizeof(*uid));
    memcpy(uid->internal, &id, sizeof(id));
    return hcclSuccess;
}

HCCL_API hcclResult_t hcclUniqueIdToString(const hcclUniqueId *id, char *buf, size_t len)
{
    static const char hex[] = "0123456789abcdef";

    if (!id || !buf)
        return HCCL_FAIL(hcclInvalidArgument, "hcclUniqueIdToString: %s is NULL",
                         id ? "buf" : "id");
    if (len < HCCL_UNIQUE_ID_STRLEN)
        return HCCL_FAIL(hcclInvalidArgument, "hcclUniqueIdToString: buffer of %zu bytes, need %d",
                         len, HCCL_UNIQUE_ID_STRLEN);
    for (size_t i = 0; i < HCCL_UNIQUE_ID_BYTES; i++) {
        buf[2 * i] = hex[(unsigned char)id->internal[i] >> 4];
        buf[2 * i + 1] = hex[(unsigned char)id->internal[i] & 15];
    }
    buf[2 * HCCL_UNIQUE_ID_BYTES] = '\0';
    return hcclSuccess;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Parses up to max bytes of hex; returns the byte count, or -1 if the text is not hex. */
int hccl_hex_decode(const char *s, unsigned char *out, size_t max)
{
    size_t n = strlen(s);

    if (n % 2 || n / 2 > max)
        return -1;
    for (size_t i = 0; i < n / 2; i++) {
        int hi = hex_digit(s[2 * i]), lo = hex_digit(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    return (int)(n / 2);
}

HCCL_API hcclResult_t hcclUniqueIdFromString(hcclUniqueId *uid, const char *str)
{
    hcclUniqueId tmp;
    hccl_id_t id;

    if (!uid || !str)
        return HCCL_FAIL(hcclInvalidArgument, "hcclUniqueIdFromString: %s is NULL",
                         uid ? "str" : "id");
    if (strlen(str) != 2 * HCCL_UNIQUE_ID_BYTES ||
        hccl_hex_decode(str, (unsigned char *)tmp.internal, sizeof(tmp.internal)) !=
            HCCL_UNIQUE_ID_BYTES)
        return HCCL_FAIL(hcclInvalidArgument, "hcclUniqueIdFromString: str is not %d hex digits",
                         2 * HCCL_UNIQUE_ID_BYTES);
    memcpy(&id, tmp.internal, sizeof(id));
    HCCL_CHECK(hccl_comm_id_check(&id, "hcclUniqueIdFromString"));
    *uid = tmp;
    return hcclSuccess;
}
