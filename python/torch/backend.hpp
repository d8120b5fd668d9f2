// hccl.torch: the torch.distributed backend "hostccl" on hccl's public C API.
//
// torch 1.13 (Debian 12's libtorch-dev) has process groups derive from c10d::ProcessGroup.
// A torch 2.x build changes only what BackendBase names (c10d::Backend), the return type of
// create() (c10::intrusive_ptr<c10d::Backend>) and registers with devices=["cpu"] in
// hccl/torch/__init__.py; the rest is the same.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <hccl.h>

namespace hccl_torch
{

using BackendBase = c10d::ProcessGroup;

class Backend;

// One operation: the hccl request, the tensors it reads and writes (held until done), what
// to do after it succeeded (copy a flat result into a list), and the future DDP waits on.
class Work : public c10d::Work
{
  public:
    Work(c10d::OpType type, std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep,
         std::function<void()> after);
    ~Work() override;

    std::vector<at::Tensor> result() override;
    // Without a timeout, the caller's thread finishes the request itself (no thread hop).
    bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  private:
    friend class Backend;
    // Called by the one thread that took the request to completion (req_ now NULL).
    void complete(hcclResult_t res, const std::string &msg);
    // The request's callback, on whichever thread completes it: wakes the completion thread
    // unless a caller waits for this Work (it finishes it itself, without a thread hop).
    static void onDone(hcclRequest_t req, hcclResult_t res, void *arg);

    std::mutex req_mtx_; // held by whoever tests or waits on req_
    hcclRequest_t req_ = nullptr;
    Backend *backend_ = nullptr;
    std::atomic<bool> waited_{false}; // wait() took it: nobody need be woken for it
    std::atomic<bool> done_{false};   // its callback ran: the request is done, or about to be
    std::string what_; // "allreduce", for messages
    std::vector<at::Tensor> outputs_;
    std::vector<at::Tensor> keep_;
    std::function<void()> after_;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class Backend : public BackendBase
{
  public:
    Backend(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
            std::chrono::milliseconds timeout);
    ~Backend() override;

    // Stops every backend's completion thread (at interpreter exit, from an atexit hook: later,
    // a thread that drops a tensor's last reference could no longer take the GIL).
    static void shutdownAll();

    static c10::intrusive_ptr<BackendBase> create(const c10::intrusive_ptr<c10d::Store> &store,
                                                  int rank, int size,
                                                  const std::chrono::duration<float> &timeout);

    const std::string getBackendName() const override
    {
        return "hostccl";
    }

    c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                             const c10d::BroadcastOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                             const c10d::AllreduceOptions &opts) override;
    c10::intrusive_ptr<c10d::Work>
    allreduce_coalesced(std::vector<at::Tensor> &tensors,
                        const c10d::AllreduceCoalescedOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor> &tensors,
                                          const c10d::ReduceOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                             std::vector<at::Tensor> &inputs,
                                             const c10d::AllgatherOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                   const c10d::AllgatherOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor> &outputs,
                                                  std::vector<std::vector<at::Tensor>> &inputs,
                                                  const c10d::ReduceScatterOptions &opts) override;
    c10::intrusive_ptr<c10d::Work>
    _reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                         const c10d::ReduceScatterOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor &output, at::Tensor &input,
                                                 std::vector<int64_t> &outputSplits,
                                                 std::vector<int64_t> &inputSplits,
                                                 const c10d::AllToAllOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor> &outputs,
                                            std::vector<at::Tensor> &inputs,
                                            const c10d::AllToAllOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors, int dstRank,
                                        int tag) override;
    c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors, int srcRank,
                                        int tag) override;

    // ops.cpp's helpers
    int rank() const
    {
        return getRank();
    }

  private:
    friend class Work; // its callback rings the completion thread
    using PostFn = std::function<hcclResult_t(hcclComm_t, hcclRequest_t *)>;
    c10::intrusive_ptr<c10d::Work> post(const char *what, c10d::OpType type, PostFn fn,
                                        std::vector<at::Tensor> outputs,
                                        std::vector<at::Tensor> keep,
                                        std::function<void()> after = nullptr);
    c10::intrusive_ptr<c10d::Work> alltoallv(at::Tensor &output, at::Tensor &input,
                                             const std::vector<int64_t> &outputSplits,
                                             const std::vector<int64_t> &inputSplits,
                                             std::function<void()> after);
    void completionLoop();
    void stopCompletion(); // idempotent; finishes what is in flight on the caller's thread

    void wakeCompletion();
    // A Work that wait() finished leaves the list the completion thread scans.
    void forget(Work *w);

    hcclComm_t comm_ = nullptr;
    int wake_fd_ = -1; // rung by a finished request nobody waits for, and to stop
    std::mutex pending_mtx_; // posting and the completion thread's scan
    std::deque<c10::intrusive_ptr<Work>> pending_;
    std::atomic<bool> stop_{false};
    std::thread completion_thread_;
    std::mutex stop_mtx_;
};

} // namespace hccl_torch
