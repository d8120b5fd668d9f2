"""hccl in asyncio: ``await comm.all_reduce_async(buf)``.

A Request is awaitable. The first await of a communicator on a running loop makes one
dispatcher for that communicator and loop: it watches the communicator's completion fd with
``loop.add_reader`` while requests are pending, and when the fd fires it tests the pending
requests and resolves their futures, on the loop's thread. The library's own threads never
run Python code. A request may be done already when it is awaited (an Async call can
finish inline), so each one is tested when it is added.
"""
import asyncio
import os
import weakref

__all__ = ["wait", "gather"]


class _Dispatcher:
    def __init__(self, comm, loop):
        self._comm = weakref.ref(comm)
        self._loop = loop
        self._fd = comm.completion_fd()
        self._pending = {}  # request -> future
        self._reading = False

    def add(self, req):
        fut = self._loop.create_future()
        if self._settle(req, fut):
            return fut
        self._pending[req] = fut
        if not self._reading:
            self._loop.add_reader(self._fd, self._on_readable)
            self._reading = True
            # Completions counted before the reader was there are still on the fd; one that
            # came between the test above and add_reader is too.
        return fut

    @staticmethod
    def _settle(req, fut):
        """Tests req; resolves fut and returns True when it is done."""
        try:
            if not req.test():
                return False
        except BaseException as exc:  # the request's hccl.Error
            if not fut.done():
                fut.set_exception(exc)
            return True
        if not fut.done():
            fut.set_result(req.wait())  # done: returns at once with its buffer
        return True

    def _on_readable(self):
        try:
            os.read(self._fd, 8)  # the counter; the requests themselves say which are done
        except BlockingIOError:
            pass
        for req, fut in list(self._pending.items()):
            if self._settle(req, fut):
                del self._pending[req]
        if not self._pending:
            self._stop_reading()

    def _stop_reading(self):
        if self._reading:
            self._loop.remove_reader(self._fd)
            self._reading = False

    def detach(self):
        """The communicator is about to go (its fd with it)."""
        if not self._loop.is_closed():
            self._stop_reading()

    def flush(self):
        """The communicator is gone: every request it had is finished now."""
        for req, fut in list(self._pending.items()):
            self._settle(req, fut)
        self._pending.clear()
        comm = self._comm()
        if comm is not None:
            comm._aio.pop(self._loop, None)


def wait(req, loop=None):
    """A future of the running loop for req (an hccl.Request); ``await req`` does this."""
    if loop is None:
        loop = asyncio.get_running_loop()
    comm = req.comm
    if req.done or comm is None or comm.closed:
        fut = loop.create_future()
        _Dispatcher._settle(req, fut)
        if not fut.done():  # cannot be: a finished communicator has no pending request
            fut.set_result(req.wait())
        return fut
    dispatchers = comm._aio
    d = dispatchers.get(loop)
    if d is None:
        d = dispatchers[loop] = _Dispatcher(comm, loop)
    return d.add(req)


async def gather(*reqs):
    """Awaits several requests at once; returns their results in order."""
    return await asyncio.gather(*(wait(r) for r in reqs))
