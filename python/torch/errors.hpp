// hccl.torch: hccl results as torch's exceptions. hcclTimeout becomes c10d::TimeoutError,
// hcclInvalidArgument c10::ValueError (Python's ValueError), hcclUnsupported
// NotImplementedError, the rest c10::Error (RuntimeError); the text is hcclGetLastError's.
#pragma once

#include <exception>
#include <string>

#include <hccl.h>

namespace hccl_torch
{

std::exception_ptr makeException(hcclResult_t res, const std::string &msg);
[[noreturn]] void throwResult(hcclResult_t res, const std::string &msg);

} // namespace hccl_torch
