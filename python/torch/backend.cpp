// hccl.torch: the backend's plumbing. The rendezvous through the c10d store, the Work objects
// and their futures, and the completion thread that finishes the requests nobody waits for:
// a request's callback only rings it, so no torch code ever runs on hccl's reactor thread;
// a request that wait() finishes, or that finished within its own call, costs no wake-up.
#include "backend.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <iterator>
#include <memory>
#include <set>

#include <pybind11/chrono.h>
#include <torch/csrc/distributed/c10d/exception.h>
#include <torch/extension.h>

#include "errors.hpp"

namespace hccl_torch
{

std::exception_ptr makeException(hcclResult_t res, const std::string &msg)
{
    try {
        if (res == hcclTimeout)
            throw c10d::TimeoutError(msg);
        if (res == hcclInvalidArgument)
            C10_THROW_ERROR(ValueError, msg);
        if (res == hcclUnsupported)
            C10_THROW_ERROR(NotImplementedError, msg);
        C10_THROW_ERROR(Error, msg);
    } catch (...) {
        return std::current_exception();
    }
}

void throwResult(hcclResult_t res, const std::string &msg)
{
    std::rethrow_exception(makeException(res, msg));
}

static std::string failureText(const char *what, hcclResult_t res)
{
    const char *detail = hcclGetLastError(nullptr);
    return std::string("hostccl ") + what + " failed (" + hcclGetErrorString(res) +
           "): " + (detail && *detail ? detail : hcclGetErrorString(res));
}

namespace
{
std::mutex live_mtx;
std::set<Backend *> live; // every backend whose completion thread may run
} // namespace

// ---- Work ----

Work::Work(c10d::OpType type, std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep,
           std::function<void()> after)
    : c10d::Work(-1, type), outputs_(std::move(outputs)), keep_(std::move(keep)),
      after_(std::move(after)), future_(c10::make_intrusive<c10::ivalue::Future>(
                                    c10::ListType::create(c10::TensorType::get())))
{
}

Work::~Work()
{
    // Only a Work whose post failed can still hold a request here: never one in flight.
    if (req_)
        hcclWait(&req_);
}

void Work::complete(hcclResult_t res, const std::string &msg)
{
    std::exception_ptr exc;

    if (res == hcclSuccess && after_) {
        try {
            after_();
        } catch (...) {
            exc = std::current_exception();
        }
    } else if (res != hcclSuccess) {
        exc = makeException(res, msg);
    }
    keep_.clear();
    after_ = nullptr;
    finish(exc);
    if (exc)
        future_->setError(exc);
    else
        future_->markCompleted(c10::IValue(outputs_));
}

void Work::onDone(hcclRequest_t req, hcclResult_t res, void *arg)
{
    Work *w = static_cast<Work *>(arg);

    (void)req, (void)res;
    w->done_.store(true);
    if (!w->waited_.load())
        w->backend_->wakeCompletion();
}

bool Work::wait(std::chrono::milliseconds timeout)
{
    if (timeout == kNoTimeout) {
        std::unique_lock<std::mutex> l(req_mtx_);
        waited_.store(true);
        if (req_) {
            hcclResult_t res = hcclWait(&req_);
            std::string msg = res == hcclSuccess ? "" : failureText(what_.c_str(), res);
            l.unlock();
            complete(res, msg);
            backend_->forget(this);
        }
    }
    return c10d::Work::wait(timeout);
}

std::vector<at::Tensor> Work::result()
{
    return outputs_;
}

c10::intrusive_ptr<c10::ivalue::Future> Work::getFuture()
{
    return future_;
}

// ---- Backend ----

Backend::Backend(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                 std::chrono::milliseconds timeout)
    : BackendBase(rank, size)
{
    // Ranks create process groups in the same order, so the n-th one of this process meets
    // the n-th one of the others under the same key of the group's (prefixed) store.
    static std::atomic<int> created{0};
    std::string key = "hostccl/unique_id/" + std::to_string(created++);
    hcclUniqueId id;
    hcclResult_t res;

    if (rank == 0) {
        if ((res = hcclGetUniqueId(&id)) != hcclSuccess)
            throwResult(res, failureText("rendezvous (hcclGetUniqueId)", res));
        store->set(key, std::vector<uint8_t>(id.internal, id.internal + sizeof(id.internal)));
    } else {
        std::vector<uint8_t> v = store->get(key); // waits up to the store's timeout
        TORCH_CHECK(v.size() == sizeof(id.internal), "hostccl: the store's ", key, " holds ",
                    v.size(), " bytes, not a unique id of ", sizeof(id.internal));
        std::memcpy(id.internal, v.data(), sizeof(id.internal));
    }
    hcclConfig_t config = HCCL_CONFIG_INITIALIZER;
    // The process group's timeout bounds every collective (0: none).
    config.execTimeoutMs = (int)std::min<int64_t>(timeout.count(), INT_MAX);
    if ((res = hcclCommInitRankConfig(&comm_, size, id, rank, &config)) != hcclSuccess)
        throwResult(res, failureText("init", res));
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) {
        hcclCommDestroy(comm_);
        TORCH_CHECK(false, "hostccl: eventfd: ", std::strerror(errno));
    }
    completion_thread_ = std::thread([this] { completionLoop(); });
    std::lock_guard<std::mutex> l(live_mtx);
    live.insert(this);
}

void Backend::wakeCompletion()
{
    uint64_t one = 1;

    if (write(wake_fd_, &one, sizeof(one)) < 0) {
        // eventfd writes fail only on overflow: the thread is awake anyway.
    }
}

void Backend::forget(Work *w)
{
    std::lock_guard<std::mutex> l(pending_mtx_);

    // Usually the last one posted.
    for (auto it = pending_.rbegin(); it != pending_.rend(); ++it) {
        if (it->get() == w) {
            pending_.erase(std::next(it).base());
            return;
        }
    }
}

void Backend::stopCompletion()
{
    std::lock_guard<std::mutex> l(stop_mtx_);

    if (!completion_thread_.joinable())
        return;
    stop_.store(true);
    wakeCompletion();
    completion_thread_.join();
    // What is still in flight finishes (a dead peer or the exec timeout fails it) here.
    std::lock_guard<std::mutex> p(pending_mtx_);
    for (auto &w : pending_) {
        std::unique_lock<std::mutex> wl(w->req_mtx_);
        if (w->req_) {
            hcclResult_t res = hcclWait(&w->req_);
            std::string msg = res == hcclSuccess ? "" : failureText(w->what_.c_str(), res);
            wl.unlock();
            w->complete(res, msg);
        }
    }
    pending_.clear();
}

void Backend::shutdownAll()
{
    std::lock_guard<std::mutex> l(live_mtx);
    for (Backend *b : live)
        b->stopCompletion();
}

Backend::~Backend()
{
    {
        std::lock_guard<std::mutex> l(live_mtx);
        live.erase(this);
    }
    {
        // The completion thread may need the GIL to drop a tensor's last reference: never
        // wait for it while holding the GIL (Python's dealloc of the group holds it).
        std::unique_ptr<pybind11::gil_scoped_release> nogil;
        if (Py_IsInitialized() && PyGILState_Check())
            nogil = std::make_unique<pybind11::gil_scoped_release>();
        stopCompletion();
        hcclCommDestroy(comm_);
    }
    close(wake_fd_);
}

c10::intrusive_ptr<BackendBase> Backend::create(const c10::intrusive_ptr<c10d::Store> &store,
                                                int rank, int size,
                                                const std::chrono::duration<float> &timeout)
{
    return c10::make_intrusive<Backend>(
        store, rank, size, std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
}

c10::intrusive_ptr<c10d::Work> Backend::post(const char *what, c10d::OpType type, PostFn fn,
                                             std::vector<at::Tensor> outputs,
                                             std::vector<at::Tensor> keep,
                                             std::function<void()> after)
{
    auto work =
        c10::make_intrusive<Work>(type, std::move(outputs), std::move(keep), std::move(after));
    hcclResult_t res, inline_res = hcclSuccess;
    std::string msg;
    int inline_done = 0;

    work->what_ = what;
    work->backend_ = this;
    {
        // Posted and listed under one lock: the completion thread, which reads its wake fd
        // before it scans the list under this lock, cannot miss a request that completes at
        // once (its callback then runs here, and rings).
        std::lock_guard<std::mutex> l(pending_mtx_);
        res = fn(comm_, &work->req_);
        // Finished within the call (the peers had posted theirs): it is finished here, before
        // anyone holds the Work or its future, so no code of the caller's runs in this call,
        // and neither the list nor the completion thread is touched.
        if (res == hcclSuccess)
            inline_res = hcclTest(&work->req_, &inline_done);
        if (res == hcclSuccess && !inline_done) {
            pending_.push_back(work);
            res = hcclRequestSetCallback(work->req_, Work::onDone, work.get());
            if (res != hcclSuccess) { // cannot happen for a fresh request; never leave it
                msg = failureText(what, res);
                hcclWait(&work->req_);
                pending_.pop_back();
            }
        } else {
            msg = failureText(what, res);
        }
    }
    if (res != hcclSuccess) {
        work->req_ = nullptr;
        throwResult(res, msg);
    }
    if (inline_done)
        work->complete(inline_res, inline_res == hcclSuccess ? "" : failureText(what, inline_res));
    return work;
}

void Backend::completionLoop()
{
    struct pollfd fds[1] = {{wake_fd_, POLLIN, 0}};
    struct Done {
        c10::intrusive_ptr<Work> work;
        hcclResult_t res;
        std::string msg;
    };
    std::vector<Done> done;
    uint64_t count;

    while (!stop_.load()) {
        if (poll(fds, 1, -1) < 0 && errno != EINTR)
            break;
        if ((fds[0].revents & POLLIN) && read(wake_fd_, &count, sizeof(count)) < 0 &&
            errno != EAGAIN)
            break;
        {
            std::lock_guard<std::mutex> l(pending_mtx_);
            for (auto it = pending_.begin(); it != pending_.end();) {
                Work *w = it->get();
                std::unique_lock<std::mutex> wl(w->req_mtx_, std::try_to_lock);
                if (!wl.owns_lock()) { // a thread in wait() finishes it
                    ++it;
                    continue;
                }
                if (!w->req_) { // finished by wait()
                    it = pending_.erase(it);
                    continue;
                }
                if (!w->done_.load()) {
                    ++it;
                    continue;
                }
                // Its callback ran: the request is done, or is marked so right after it.
                hcclResult_t res = hcclWait(&w->req_);
                w->req_ = nullptr;
                done.push_back(
                    {*it, res, res == hcclSuccess ? "" : failureText(w->what_.c_str(), res)});
                it = pending_.erase(it);
            }
        }
        // Outside the lock: a future's callback may post the next collective.
        for (auto &d : done)
            d.work->complete(d.res, d.msg);
        done.clear();
    }
}

} // namespace hccl_torch

PYBIND11_MODULE(_C, m)
{
    m.doc() = "hccl's torch.distributed backend (import hccl.torch to register \"hostccl\")";
    m.def("create", &hccl_torch::Backend::create, pybind11::arg("store"), pybind11::arg("rank"),
          pybind11::arg("size"), pybind11::arg("timeout"),
          pybind11::call_guard<pybind11::gil_scoped_release>());
    m.def("_shutdown", &hccl_torch::Backend::shutdownAll,
          pybind11::call_guard<pybind11::gil_scoped_release>());
}
