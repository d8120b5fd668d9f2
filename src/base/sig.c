/* Collective signatures: what a call is, in 32 bits, on every frame and lane block. */
#include <stdio.h>
#include <string.h>

#include "base/base.h"

uint32_t hccl_sig_make(int coll, int dtype, int op, int root, uint64_t count)
{
    uint32_t h = 2166136261u;

    for (int i = 0; i < 8; i++)
        h = (h ^ (uint32_t)((count >> (8 * i)) & 0xff)) * 16777619u;
    /* the kind + 1 keeps it non-zero; the count only as a 12-bit hash */
    return ((uint32_t)(coll + 1) & 0xf) << 28 | ((uint32_t)dtype & 0xf) << 24 |
           ((uint32_t)op & 0x7) << 21 | ((uint32_t)(root + 1) & 0x1ff) << 12 | (h & 0xfff);
}

void hccl_sig_describe(uint32_t sig, char *buf, size_t len)
{
    hccl_coll_t coll = (hccl_coll_t)((sig >> 28) - 1);
    const char *dt = hccl_dtype_name((hcclDataType_t)((sig >> 24) & 0xf));
    const char *op = hccl_op_name((hcclRedOp_t)((sig >> 21) & 0x7));
    int root = (int)((sig >> 12) & 0x1ff) - 1;

    if (coll == HCCL_COLL_BROADCAST)
        snprintf(buf, len, "broadcast(%s, root %d)", dt, root);
    else if (coll == HCCL_COLL_REDUCE)
        snprintf(buf, len, "reduce(%s, %s, root %d)", dt, op, root);
    else if (coll == HCCL_COLL_ALLREDUCE || coll == HCCL_COLL_REDUCESCATTER)
        snprintf(buf, len, "%s(%s, %s)", hccl_coll_name(coll), dt, op);
    else if (coll == HCCL_COLL_BARRIER)
        snprintf(buf, len, "barrier()");
    else
        snprintf(buf, len, "%s(%s)", hccl_coll_name(coll), dt);
    if (strlen(buf) + 24 < len)
        snprintf(buf + strlen(buf), len - strlen(buf), " [count hash %03x]", sig & 0xfff);
}
