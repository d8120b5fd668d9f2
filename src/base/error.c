/* Thread-local last-error text and the result strings. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"

#define HCCL_ERRMSG_BYTES 1024

static _Thread_local char last_error[HCCL_ERRMSG_BYTES];

static hcclResult_t error_vset(int level, hcclResult_t res, const char *fmt, va_list ap)
{
    int saved = errno;
    char text[HCCL_ERRMSG_BYTES];

    /* Through a copy: the arguments may include the previous text itself. */
    vsnprintf(text, sizeof(text), fmt, ap);
    memcpy(last_error, text, sizeof(text));
    if (level == HCCL_LOG_WARN)
        hccl_log_write(HCCL_LOG_WARN, HCCL_SUB_ALL, "%s", last_error);
    else
        HCCL_INFO(HCCL_SUB_ALL, "%s", last_error);
    errno = saved;
    return res;
}

hcclResult_t hccl_error_set(hcclResult_t res, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    res = error_vset(HCCL_LOG_WARN, res, fmt, ap);
    va_end(ap);
    return res;
}

hcclResult_t hccl_error_set_quiet(hcclResult_t res, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    res = error_vset(HCCL_LOG_INFO, res, fmt, ap);
    va_end(ap);
    return res;
}

const char *hccl_error_last(void)
{
    return last_error;
}

void hccl_error_put(const char *text)
{
    snprintf(last_error, sizeof(last_error), "%s", text ? text : "");
}

HCCL_API const char *hcclGetErrorString(hcclResult_t result)
{
    switch (result) {
    case hcclSuccess: return "no error";
    case hcclInvalidArgument: return "invalid argument";
    case hcclInvalidUsage: return "invalid usage";
    case hcclSystemError: return "system error";
    case hcclRemoteError: return "remote error (a peer died, disconnected or failed)";
    case hcclTimeout: return "timeout";
    case hcclInProgress: return "operation in progress";
    case hcclAborted: return "communicator aborted";
    case hcclUnsupported: return "unsupported";
    case hcclInternalError: return "internal error";
    default: return "unknown result code";
    }
}

HCCL_API const char *hcclGetLastError(hcclComm_t comm)
{
    (void)comm; /* the text is per thread, whatever the communicator */
    return last_error;
}

HCCL_API hcclResult_t hcclGetVersion(int *version)
{
    if (version == NULL)
        return HCCL_FAIL(hcclInvalidArgument, "hcclGetVersion: version is NULL");
    *version = HCCL_VERSION_CODE;
    return hcclSuccess;
}
