// hccl.torch: the collectives of the "hostccl" backend. Each checks its tensors (dense,
// CPU, contiguous, a dtype hccl has), picks hccl's dtype and op, and posts one hccl request;
// list forms go through one flat tensor and copy out after it succeeded.
#include "backend.hpp"

#include <numeric>

#include <torch/csrc/distributed/c10d/Types.hpp>

#include "errors.hpp"

namespace hccl_torch
{

namespace
{

struct Type {
    hcclDataType_t dtype;
    bool is_bool;
};

void checkTensor(const at::Tensor &t, const char *what)
{
    TORCH_CHECK_VALUE(t.layout() == c10::kStrided, "hostccl ", what,
                      ": sparse tensors are not supported");
    TORCH_CHECK_VALUE(t.device().is_cpu(), "hostccl ", what, ": a tensor on ", t.device(),
                      "; hostccl moves host memory (CPU tensors only)");
    TORCH_CHECK_VALUE(t.is_contiguous(), "hostccl ", what, ": the tensor is not contiguous");
}

Type typeOf(const at::Tensor &t, const char *what)
{
    checkTensor(t, what);
    switch (t.scalar_type()) {
    case at::kFloat:
        return {hcclFloat32, false};
    case at::kDouble:
        return {hcclFloat64, false};
    case at::kHalf:
        return {hcclFloat16, false};
    case at::kBFloat16:
        return {hcclBfloat16, false};
    case at::kChar:
        return {hcclInt8, false};
    case at::kByte:
        return {hcclUint8, false};
    case at::kInt:
        return {hcclInt32, false};
    case at::kLong:
        return {hcclInt64, false};
    case at::kBool:
        return {hcclUint8, true};
    default:
        TORCH_CHECK_TYPE(false, "hostccl ", what, ": tensors of ", t.scalar_type(),
                         " are not supported (float32/64, float16, bfloat16, int8, uint8, "
                         "int32, int64 and bool are)");
    }
}

// Bools reduce as uint8: SUM and MAX are "any", PRODUCT and MIN "all".
hcclRedOp_t opOf(const c10d::ReduceOp &op, const Type &type, const char *what)
{
    hcclRedOp_t r;
    switch (op.op_) {
    case c10d::ReduceOp::SUM:
        r = hcclSum;
        break;
    case c10d::ReduceOp::PRODUCT:
        r = hcclProd;
        break;
    case c10d::ReduceOp::MIN:
        r = hcclMin;
        break;
    case c10d::ReduceOp::MAX:
        r = hcclMax;
        break;
    case c10d::ReduceOp::AVG:
        TORCH_CHECK_VALUE(!type.is_bool, "hostccl ", what, ": AVG of bool tensors");
        r = hcclAvg;
        break;
    default:
        TORCH_CHECK_NOT_IMPLEMENTED(false, "hostccl ", what, ": ReduceOp ", (int)op.op_,
                                    " (BAND, BOR, BXOR, PREMUL_SUM) is not supported; SUM, "
                                    "PRODUCT, MIN, MAX and AVG are");
    }
    if (type.is_bool)
        r = (r == hcclSum || r == hcclMax) ? hcclMax : hcclMin;
    return r;
}

const at::Tensor &single(const std::vector<at::Tensor> &tensors, const char *what)
{
    TORCH_CHECK_VALUE(tensors.size() == 1, "hostccl ", what,
                      ": expected one tensor per call (one device per process), got ",
                      tensors.size());
    return tensors[0];
}

void sameType(const at::Tensor &a, const at::Tensor &b, const char *what)
{
    TORCH_CHECK_VALUE(a.scalar_type() == b.scalar_type(), "hostccl ", what,
                      ": tensors of different dtypes (", a.scalar_type(), " and ", b.scalar_type(),
                      ")");
}

size_t n(const at::Tensor &t)
{
    return (size_t)t.numel();
}

} // namespace

c10::intrusive_ptr<c10d::Work> Backend::allreduce(std::vector<at::Tensor> &tensors,
                                                  const c10d::AllreduceOptions &opts)
{
    at::Tensor t = single(tensors, "allreduce");
    Type ty = typeOf(t, "allreduce");
    hcclRedOp_t op = opOf(opts.reduceOp, ty, "allreduce");
    return post("allreduce", c10d::OpType::ALLREDUCE,
                [=](hcclComm_t c, hcclRequest_t *r) {
                    return hcclAllReduceAsync(t.data_ptr(), t.data_ptr(), n(t), ty.dtype, op, c, r);
                },
                {t}, {});
}

c10::intrusive_ptr<c10d::Work>
Backend::allreduce_coalesced(std::vector<at::Tensor> &tensors,
                             const c10d::AllreduceCoalescedOptions &opts)
{
    TORCH_CHECK_VALUE(!tensors.empty(), "hostccl allreduce_coalesced: no tensors");
    Type ty = typeOf(tensors[0], "allreduce_coalesced");
    hcclRedOp_t op = opOf(opts.reduceOp, ty, "allreduce_coalesced");
    std::vector<at::Tensor> flat_views;
    for (auto &t : tensors) {
        typeOf(t, "allreduce_coalesced");
        sameType(t, tensors[0], "allreduce_coalesced");
        flat_views.push_back(t.view(-1));
    }
    at::Tensor flat = at::cat(flat_views);
    std::vector<at::Tensor> outs = tensors;
    auto after = [flat, outs]() mutable {
        int64_t off = 0;
        for (auto &t : outs) {
            t.view(-1).copy_(flat.narrow(0, off, t.numel()));
            off += t.numel();
        }
    };
    return post(
        "allreduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED,
        [=](hcclComm_t c, hcclRequest_t *r) {
            return hcclAllReduceAsync(flat.data_ptr(), flat.data_ptr(), n(flat), ty.dtype, op, c,
                                      r);
        },
        outs, {flat}, after);
}

c10::intrusive_ptr<c10d::Work> Backend::broadcast(std::vector<at::Tensor> &tensors,
                                                  const c10d::BroadcastOptions &opts)
{
    at::Tensor t = single(tensors, "broadcast");
    Type ty = typeOf(t, "broadcast");
    int root = (int)opts.rootRank;
    TORCH_CHECK_VALUE(root >= 0 && root < getSize(), "hostccl broadcast: root ", root,
                      " is not a rank of the group");
    return post("broadcast", c10d::OpType::BROADCAST,
                [=](hcclComm_t c, hcclRequest_t *r) {
                    return hcclBroadcastAsync(t.data_ptr(), n(t), ty.dtype, root, c, r);
                },
                {t}, {});
}

c10::intrusive_ptr<c10d::Work> Backend::reduce(std::vector<at::Tensor> &tensors,
                                               const c10d::ReduceOptions &opts)
{
    at::Tensor t = single(tensors, "reduce");
    Type ty = typeOf(t, "reduce");
    hcclRedOp_t op = opOf(opts.reduceOp, ty, "reduce");
    int root = (int)opts.rootRank;
    TORCH_CHECK_VALUE(root >= 0 && root < getSize(), "hostccl reduce: root ", root,
                      " is not a rank of the group");
    return post("reduce", c10d::OpType::REDUCE,
                [=](hcclComm_t c, hcclRequest_t *r) {
                    return hcclReduceAsync(t.data_ptr(), t.data_ptr(), n(t), ty.dtype, op, root, c,
                                           r);
                },
                {t}, {});
}

c10::intrusive_ptr<c10d::Work> Backend::_allgather_base(at::Tensor &output, at::Tensor &input,
                                                        const c10d::AllgatherOptions &)
{
    Type ty = typeOf(input, "allgather");
    typeOf(output, "allgather");
    sameType(input, output, "allgather");
    TORCH_CHECK_VALUE(output.numel() == input.numel() * getSize(), "hostccl allgather: output has ",
                      output.numel(), " elements, expected ", input.numel() * getSize());
    at::Tensor in = input, out = output;
    return post("allgather", c10d::OpType::_ALLGATHER_BASE,
                [=](hcclComm_t c, hcclRequest_t *r) {
                    return hcclAllGatherAsync(in.data_ptr(), out.data_ptr(), n(in), ty.dtype, c, r);
                },
                {out}, {in});
}

c10::intrusive_ptr<c10d::Work> Backend::allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                                  std::vector<at::Tensor> &inputs,
                                                  const c10d::AllgatherOptions &)
{
    at::Tensor in = single(inputs, "allgather");
    Type ty = typeOf(in, "allgather");
    TORCH_CHECK_VALUE(outputs.size() == 1 && (int)outputs[0].size() == getSize(),
                      "hostccl allgather: expected one list of ", getSize(), " output tensors");
    for (auto &o : outputs[0]) {
        sameType(o, in, "allgather");
        TORCH_CHECK_VALUE(o.numel() == in.numel() && o.device().is_cpu(),
                          "hostccl allgather: every output must be a CPU tensor of ", in.numel(),
                          " elements");
    }
    at::Tensor flat = at::empty({(int64_t)getSize() * in.numel()}, in.options());
    std::vector<at::Tensor> outs = outputs[0];
    auto after = [flat, outs]() mutable {
        for (size_t i = 0; i < outs.size(); i++)
            outs[i].copy_(flat.narrow(0, (int64_t)i * outs[i].numel(), outs[i].numel())
                              .view(outs[i].sizes()));
    };
    return post(
        "allgather", c10d::OpType::ALLGATHER,
        [=](hcclComm_t c, hcclRequest_t *r) {
            return hcclAllGatherAsync(in.data_ptr(), flat.data_ptr(), n(in), ty.dtype, c, r);
        },
        outs, {in, flat}, after);
}

c10::intrusive_ptr<c10d::Work> Backend::_reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                                                             const c10d::ReduceScatterOptions &opts)
{
    Type ty = typeOf(input, "reduce_scatter");
    typeOf(output, "reduce_scatter");
    sameType(input, output, "reduce_scatter");
    hcclRedOp_t op = opOf(opts.reduceOp, ty, "reduce_scatter");
    TORCH_CHECK_VALUE(input.numel() == output.numel() * getSize(),
                      "hostccl reduce_scatter: input "
                      "has ",
                      input.numel(), " elements, expected ", output.numel() * getSize());
    at::Tensor in = input, out = output;
    return post("reduce_scatter", c10d::OpType::_REDUCE_SCATTER_BASE,
                [=](hcclComm_t c, hcclRequest_t *r) {
                    return hcclReduceScatterAsync(in.data_ptr(), out.data_ptr(), n(out), ty.dtype,
                                                  op, c, r);
                },
                {out}, {in});
}

c10::intrusive_ptr<c10d::Work> Backend::reduce_scatter(std::vector<at::Tensor> &outputs,
                                                       std::vector<std::vector<at::Tensor>> &inputs,
                                                       const c10d::ReduceScatterOptions &opts)
{
    at::Tensor out = single(outputs, "reduce_scatter");
    TORCH_CHECK_VALUE(inputs.size() == 1 && (int)inputs[0].size() == getSize(),
                      "hostccl reduce_scatter: expected one list of ", getSize(), " input tensors");
    std::vector<at::Tensor> views;
    for (auto &t : inputs[0]) {
        typeOf(t, "reduce_scatter");
        TORCH_CHECK_VALUE(t.numel() == out.numel(),
                          "hostccl reduce_scatter: every input must "
                          "have the output's ",
                          out.numel(), " elements");
        views.push_back(t.reshape(-1));
    }
    at::Tensor flat = at::cat(views);
    return _reduce_scatter_base(out, flat, opts);
}

c10::intrusive_ptr<c10d::Work> Backend::alltoall_base(at::Tensor &output, at::Tensor &input,
                                                      std::vector<int64_t> &outputSplits,
                                                      std::vector<int64_t> &inputSplits,
                                                      const c10d::AllToAllOptions &)
{
    return alltoallv(output, input, outputSplits, inputSplits, nullptr);
}

c10::intrusive_ptr<c10d::Work> Backend::alltoallv(at::Tensor &output, at::Tensor &input,
                                                  const std::vector<int64_t> &outputSplits,
                                                  const std::vector<int64_t> &inputSplits,
                                                  std::function<void()> after)
{
    Type ty = typeOf(input, "alltoall");
    typeOf(output, "alltoall");
    sameType(input, output, "alltoall");
    at::Tensor in = input, out = output;
    size_t size = (size_t)getSize();
    if (outputSplits.empty() && inputSplits.empty()) {
        TORCH_CHECK_VALUE(in.numel() == out.numel() && n(in) % size == 0,
                          "hostccl alltoall: "
                          "input and output must have the same number of elements, a multiple "
                          "of the group size");
        return post("alltoall", c10d::OpType::ALLTOALL_BASE,
                    [=](hcclComm_t c, hcclRequest_t *r) {
                        return hcclAlltoAllAsync(in.data_ptr(), out.data_ptr(), n(in) / size,
                                                 ty.dtype, c, r);
                    },
                    {out}, {in});
    }
    // Splits count rows of dim 0; hccl counts elements.
    auto v = std::make_shared<std::vector<size_t>>(4 * size);
    auto fill = [&](const std::vector<int64_t> &splits, const at::Tensor &t, size_t *counts,
                    size_t *displs, const char *which) {
        size_t rows = t.dim() > 0 ? (size_t)t.size(0) : 1, row = rows ? n(t) / rows : 0, off = 0;
        TORCH_CHECK_VALUE(splits.empty() || splits.size() == size, "hostccl alltoall: ", which,
                          " splits must have ", size, " entries");
        for (size_t i = 0; i < size; i++) {
            size_t k = splits.empty() ? rows / size : (size_t)splits[i];
            counts[i] = k * row;
            displs[i] = off;
            off += k * row;
        }
        TORCH_CHECK_VALUE(off <= n(t), "hostccl alltoall: the ", which, " splits cover ", off,
                          " elements of a tensor of ", n(t));
    };
    size_t *p = v->data();
    fill(inputSplits, in, p, p + size, "input");
    fill(outputSplits, out, p + 2 * size, p + 3 * size, "output");
    return post(
        "alltoall", c10d::OpType::ALLTOALL_BASE,
        [=](hcclComm_t c, hcclRequest_t *r) {
            size_t *q = v->data();
            return hcclAlltoAllvAsync(in.data_ptr(), q, q + size, out.data_ptr(), q + 2 * size,
                                      q + 3 * size, ty.dtype, c, r);
        },
        {out}, {in},
        [v, after]() {
            if (after)
                after();
        });
}

c10::intrusive_ptr<c10d::Work> Backend::alltoall(std::vector<at::Tensor> &outputs,
                                                 std::vector<at::Tensor> &inputs,
                                                 const c10d::AllToAllOptions &)
{
    size_t size = (size_t)getSize();
    TORCH_CHECK_VALUE(outputs.size() == size && inputs.size() == size,
                      "hostccl alltoall: expected ", size, " input and output tensors");
    std::vector<at::Tensor> ins, outs;
    std::vector<int64_t> isplit, osplit;
    for (size_t i = 0; i < size; i++) {
        typeOf(inputs[i], "alltoall");
        typeOf(outputs[i], "alltoall");
        ins.push_back(inputs[i].reshape(-1));
        isplit.push_back(inputs[i].numel());
        osplit.push_back(outputs[i].numel());
    }
    at::Tensor in = at::cat(ins);
    at::Tensor out = at::empty({std::accumulate(osplit.begin(), osplit.end(), (int64_t)0)},
                               outputs[0].options());
    std::vector<at::Tensor> dst = outputs;
    auto after = [out, dst, osplit]() mutable {
        int64_t off = 0;
        for (size_t i = 0; i < dst.size(); i++) {
            dst[i].view(-1).copy_(out.narrow(0, off, osplit[i]));
            off += osplit[i];
        }
    };
    return alltoallv(out, in, osplit, isplit, after);
}

c10::intrusive_ptr<c10d::Work> Backend::barrier(const c10d::BarrierOptions &)
{
    return post("barrier", c10d::OpType::BARRIER,
                [](hcclComm_t c, hcclRequest_t *r) { return hcclBarrierAsync(c, r); }, {}, {});
}

c10::intrusive_ptr<c10d::Work> Backend::send(std::vector<at::Tensor> &tensors, int dstRank, int tag)
{
    at::Tensor t = single(tensors, "send");
    Type ty = typeOf(t, "send");
    TORCH_CHECK_NOT_IMPLEMENTED(tag == 0, "hostccl send: tags are not supported (sends and "
                                          "receives between two ranks match in posting order)");
    TORCH_CHECK_VALUE(dstRank >= 0 && dstRank < getSize(), "hostccl send: no rank ", dstRank);
    return post("send", c10d::OpType::SEND,
                [=](hcclComm_t c, hcclRequest_t *r) {
                    return hcclSendAsync(t.data_ptr(), n(t), ty.dtype, dstRank, c, r);
                },
                {}, {t});
}

c10::intrusive_ptr<c10d::Work> Backend::recv(std::vector<at::Tensor> &tensors, int srcRank, int tag)
{
    at::Tensor t = single(tensors, "recv");
    Type ty = typeOf(t, "recv");
    TORCH_CHECK_NOT_IMPLEMENTED(tag == 0, "hostccl recv: tags are not supported (sends and "
                                          "receives between two ranks match in posting order)");
    TORCH_CHECK_VALUE(srcRank >= 0 && srcRank < getSize(), "hostccl recv: no rank ", srcRank);
    return post("recv", c10d::OpType::RECV,
                [=](hcclComm_t c, hcclRequest_t *r) {
                    return hcclRecvAsync(t.data_ptr(), n(t), ty.dtype, srcRank, c, r);
                },
                {t}, {});
}

} // namespace hccl_torch
