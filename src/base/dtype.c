/* Data types, reduction ops and collective kinds: sizes and names. */
#include "base/base.h"

size_t hccl_dtype_size(hcclDataType_t dt)
{
    switch (dt) {
    case hcclInt8:
    case hcclUint8:
        return 1;
    case hcclFloat16:
    case hcclBfloat16:
        return 2;
    case hcclInt32:
    case hcclUint32:
    case hcclFloat32:
        return 4;
    case hcclInt64:
    case hcclUint64:
    case hcclFloat64:
        return 8;
    default:
        return 0;
    }
}

const char *hccl_dtype_name(hcclDataType_t dt)
{
    switch (dt) {
    case hcclInt8:
        return "int8";
    case hcclUint8:
        return "uint8";
    case hcclInt32:
        return "int32";
    case hcclUint32:
        return "uint32";
    case hcclInt64:
        return "int64";
    case hcclUint64:
        return "uint64";
    case hcclFloat16:
        return "float16";
    case hcclBfloat16:
        return "bfloat16";
    case hcclFloat32:
        return "float32";
    case hcclFloat64:
        return "float64";
    default:
        return "unknown";
    }
}

const char *hccl_op_name(hcclRedOp_t op)
{
    switch (op) {
    case hcclSum:
        return "sum";
    case hcclProd:
        return "prod";
    case hcclMax:
        return "max";
    case hcclMin:
        return "min";
    case hcclAvg:
        return "avg";
    default:
        return "unknown";
    }
}

static const char *const coll_names[HCCL_NUM_COLLS] = {
    "allreduce", "broadcast", "reduce", "allgather", "reducescatter", "alltoall", "alltoallv",
    "barrier", "send", "recv",
};

const char *hccl_coll_name(hccl_coll_t coll)
{
    return (unsigned)coll < HCCL_NUM_COLLS ? coll_names[coll] : "unknown";
}
