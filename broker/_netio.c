/* The Kafka listener's socket I/O on a thread of its own (see broker/netio.py).
 *
 * One pthread runs an epoll loop: it accepts connections on the listening sockets it is
 * given, reads length-prefixed request frames into buffers of their exact size (a frame
 * larger than the limit ends the connection's reading), and writes the responses queued
 * for each connection with writev, keeping partial writes. It never touches a Python
 * object and never holds the GIL: the event loop's thread hands over response buffers
 * (their Py_buffer views are released back on that thread) and takes complete frames,
 * new connections and ends of stream as one list per wake-up of a single eventfd.
 *
 * Shared state (the connection table, each connection's queued output and requested
 * state, the list of events for Python) is guarded by one mutex, held only for list
 * manipulation, never across a system call that may block.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define EV_ACCEPTED 1
#define EV_FRAME 2
#define EV_EOF 3
#define EV_DRAINED 4
#define EV_CLOSED 5

#define SCRATCH_BYTES (256 * 1024)
/* Frames at least this large (still to come) are received straight into their buffer. */
#define DIRECT_BYTES (32 * 1024)
#define MAX_IOV 64
#define MAX_LISTENERS 16
/* Released output bytes held before the loop thread is woken just to release them. */
#define RELEASE_WAKE_BYTES (1 << 20)
/* Bytes read from one connection per pass, so one busy client cannot starve the others. */
#define READ_PASS_BYTES (1 << 20)

typedef struct Chunk {
    struct Chunk *next;
    Py_buffer view;      /* released on the loop thread (needs the GIL) */
    Py_ssize_t offset;   /* bytes of it already written */
} Chunk;

typedef struct Event {
    struct Event *next;
    int kind;
    uint64_t id;
    char *data;          /* a frame (EV_FRAME) or a message (EV_ACCEPTED peer, EV_EOF reason) */
    Py_ssize_t size;
} Event;

typedef struct Conn {
    uint64_t id;
    int fd;
    /* --- shared (under the mutex) */
    Chunk *pend_head, *pend_tail;   /* output queued by Python, not yet taken by the thread */
    Py_ssize_t backlog;             /* bytes queued and not yet written */
    Py_ssize_t drain_at;            /* >= 0: report EV_DRAINED once backlog <= drain_at */
    int want_paused;
    int want_close;                 /* 1: close once the output is written; 2: close now */
    int dirty;                      /* on the command list */
    struct Conn *next_dirty;
    /* --- the I/O thread's own */
    Chunk *out_head, *out_tail;
    int paused, eof, dead, readable, writable, queued, hup;
    struct Conn *next_todo, *next_served;
    Py_ssize_t written;
    unsigned char hdr[4];
    int hdr_got;
    char *frame;
    Py_ssize_t frame_size, frame_got;
} Conn;

typedef struct {
    PyObject_HEAD
    pthread_t thread;
    int started, stopping, stopped;
    int epfd, wakefd, notifyfd;
    int listeners[MAX_LISTENERS];
    int nlisteners;
    Py_ssize_t max_frame;
    pthread_mutex_t mu;
    atomic_int io_wake_pending;
    atomic_int py_wake_pending;
    /* connection table: slot -> Conn (NULL when free) */
    Conn **slots;
    uint32_t nslots;
    uint32_t *free_slots;
    uint32_t nfree;
    uint32_t generation;
    Py_ssize_t nconns;
    Conn *dirty_head;
    Event *ev_head, *ev_tail;
    Chunk *rel_head;                /* written or dropped output, released by poll() */
    Py_ssize_t rel_bytes;
    Conn *todo_head;                /* the thread's: connections with work to do */
    char *scratch;
    /* counters */
    uint64_t n_frames, n_accepted, n_wakeups, n_reads, n_writes, bytes_in, bytes_out;
} IOThread;

typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t size;
    Py_ssize_t exports;
} Frame;

static PyTypeObject FrameType;

/* ------------------------------------------------------------------ helpers */

static void signal_fd(int fd) {
    uint64_t one = 1;
    ssize_t r;
    do { r = write(fd, &one, sizeof one); } while (r < 0 && errno == EINTR);
}

static void drain_fd(int fd) {
    uint64_t v;
    ssize_t r;
    do { r = read(fd, &v, sizeof v); } while (r < 0 && errno == EINTR);
}

static Conn *lookup(IOThread *t, uint64_t id) {
    uint32_t slot = (uint32_t)(id & 0xffffffffu);
    if (slot >= t->nslots) return NULL;
    Conn *c = t->slots[slot];
    return (c != NULL && c->id == id) ? c : NULL;
}

static Event *new_event(int kind, uint64_t id, char *data, Py_ssize_t size) {
    Event *e = malloc(sizeof *e);
    if (!e) { free(data); return NULL; }
    e->kind = kind; e->id = id; e->data = data; e->size = size; e->next = NULL;
    return e;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s);
    char *p = malloc(n + 1);
    if (p) memcpy(p, s, n + 1);
    return p;
}

/* The thread's batch of events for Python, published at the end of a pass. */
typedef struct { Event *head, *tail; Chunk *rel; Py_ssize_t rel_bytes; } Batch;

static void batch_event(Batch *b, int kind, uint64_t id, char *data, Py_ssize_t size) {
    Event *e = new_event(kind, id, data, size);
    if (!e) return;  /* out of memory: the event is lost (an EOF then shows as idle) */
    if (b->tail) b->tail->next = e; else b->head = e;
    b->tail = e;
}

static void batch_release(Batch *b, Chunk *c) {
    b->rel_bytes += c->view.len;
    c->next = b->rel;
    b->rel = c;
}

static void release_list(Batch *b, Chunk *c) {
    while (c) { Chunk *n = c->next; batch_release(b, c); c = n; }
}

static void todo_add(IOThread *t, Conn *c) {
    if (!c->queued) { c->queued = 1; c->next_todo = t->todo_head; t->todo_head = c; }
}

/* ------------------------------------------------------------------ the I/O thread */

static void accept_all(IOThread *t, int lfd, Batch *b) {
    for (;;) {
        struct sockaddr_storage addr;
        socklen_t alen = sizeof addr;
        int fd = accept4(lfd, (struct sockaddr *)&addr, &alen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            return;  /* EAGAIN, or out of descriptors: retried at the next readiness */
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        char host[INET6_ADDRSTRLEN] = "?";
        int port = 0;
        if (addr.ss_family == AF_INET) {
            struct sockaddr_in *a = (struct sockaddr_in *)&addr;
            inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
            port = ntohs(a->sin_port);
        } else if (addr.ss_family == AF_INET6) {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&addr;
            inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
            port = ntohs(a->sin6_port);
        }
        char peer[INET6_ADDRSTRLEN + 16];
        snprintf(peer, sizeof peer, "%s:%d", host, port);
        Conn *c = calloc(1, sizeof *c);
        if (!c) { close(fd); continue; }
        c->fd = fd;
        c->drain_at = -1;
        pthread_mutex_lock(&t->mu);
        uint32_t slot;
        if (t->nfree) {
            slot = t->free_slots[--t->nfree];
        } else {
            if (t->nslots == UINT32_MAX) { pthread_mutex_unlock(&t->mu); close(fd); free(c); continue; }
            uint32_t n = t->nslots ? t->nslots * 2 : 1024;
            Conn **s = realloc(t->slots, n * sizeof *s);
            uint32_t *f = s ? realloc(t->free_slots, n * sizeof *f) : NULL;
            if (s) t->slots = s;
            if (!s || !f) { pthread_mutex_unlock(&t->mu); close(fd); free(c); continue; }
            t->free_slots = f;
            for (uint32_t i = t->nslots; i < n; i++) s[i] = NULL;
            /* new slots are free, the lowest one taken now */
            for (uint32_t i = n - 1; i > t->nslots; i--) t->free_slots[t->nfree++] = i;
            slot = t->nslots;
            t->nslots = n;
        }
        t->generation++;
        c->id = ((uint64_t)t->generation << 32) | slot;
        t->slots[slot] = c;
        t->nconns++;
        pthread_mutex_unlock(&t->mu);
        t->n_accepted++;
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.ptr = c};
        if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
            c->eof = c->dead = 1;
            batch_event(b, EV_ACCEPTED, c->id, dup_str(peer), 0);
            batch_event(b, EV_EOF, c->id, dup_str("cannot watch the connection"), 0);
            continue;
        }
        c->writable = 1;
        batch_event(b, EV_ACCEPTED, c->id, dup_str(peer), 0);
    }
}

static void end_reading(Conn *c, Batch *b, const char *reason) {
    if (c->eof) return;
    c->eof = 1;
    free(c->frame);
    c->frame = NULL;
    c->hdr_got = 0;
    batch_event(b, EV_EOF, c->id, reason ? dup_str(reason) : NULL, 0);
}

/* Takes bytes of the stream; returns 0, or -1 when the connection must stop reading. */
static int consume(IOThread *t, Conn *c, const char *p, Py_ssize_t n, Batch *b) {
    while (n > 0) {
        if (c->frame == NULL) {
            Py_ssize_t take = 4 - c->hdr_got;
            if (take > n) take = n;
            memcpy(c->hdr + c->hdr_got, p, take);
            c->hdr_got += (int)take; p += take; n -= take;
            if (c->hdr_got < 4) return 0;
            int32_t size = (int32_t)(((uint32_t)c->hdr[0] << 24) | ((uint32_t)c->hdr[1] << 16) |
                                     ((uint32_t)c->hdr[2] << 8) | (uint32_t)c->hdr[3]);
            c->hdr_got = 0;
            if (size < 0 || (Py_ssize_t)size > t->max_frame) {
                char msg[128];
                snprintf(msg, sizeof msg, "request of %d bytes is larger than max.request.bytes=%zd",
                         (int)size, t->max_frame);
                end_reading(c, b, msg);
                return -1;
            }
            c->frame = malloc(size > 0 ? (size_t)size : 1);
            if (!c->frame) { end_reading(c, b, "out of memory for a request"); return -1; }
            c->frame_size = size;
            c->frame_got = 0;
        }
        Py_ssize_t take = c->frame_size - c->frame_got;
        if (take > n) take = n;
        memcpy(c->frame + c->frame_got, p, take);
        c->frame_got += take; p += take; n -= take;
        if (c->frame_got == c->frame_size) {
            batch_event(b, EV_FRAME, c->id, c->frame, c->frame_size);
            t->n_frames++;
            c->frame = NULL;
        }
    }
    return 0;
}

/* Reads what the connection has (up to a pass's worth); leaves c->readable set when more may wait. */
static void do_read(IOThread *t, Conn *c, Batch *b) {
    Py_ssize_t total = 0;
    while (c->readable && !c->paused && !c->eof && total < READ_PASS_BYTES) {
        ssize_t r;
        int direct = c->frame != NULL && c->frame_size - c->frame_got >= DIRECT_BYTES;
        size_t want = direct ? (size_t)(c->frame_size - c->frame_got) : SCRATCH_BYTES;
        char *into = direct ? c->frame + c->frame_got : t->scratch;
        r = recv(c->fd, into, want, 0);
        t->n_reads++;
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) { c->readable = 0; return; }
            c->dead = 1;  /* reset: nothing more can be written either */
            end_reading(c, b, NULL);
            return;
        }
        if (r == 0) { end_reading(c, b, NULL); return; }
        t->bytes_in += (uint64_t)r;
        total += r;
        if (direct) {
            c->frame_got += r;
            if (c->frame_got == c->frame_size) {
                batch_event(b, EV_FRAME, c->id, c->frame, c->frame_size);
                t->n_frames++;
                c->frame = NULL;
            }
        } else if (consume(t, c, t->scratch, r, b) < 0) {
            return;
        }
        /* A short read drained the socket; unless the peer has ended, whose end may already
         * be queued behind the data (edge-triggered: no new event would report it). */
        if ((size_t)r < want && !c->hup) { c->readable = 0; return; }
    }
}

static void drop_output(Conn *c, Batch *b, IOThread *t) {
    release_list(b, c->out_head);
    c->out_head = c->out_tail = NULL;
}

/* Writes queued output; returns bytes written. */
static Py_ssize_t do_write(IOThread *t, Conn *c, Batch *b) {
    Py_ssize_t written = 0;
    while (c->out_head && c->writable && !c->dead) {
        struct iovec iov[MAX_IOV];
        int n = 0;
        for (Chunk *k = c->out_head; k && n < MAX_IOV; k = k->next) {
            iov[n].iov_base = (char *)k->view.buf + k->offset;
            iov[n].iov_len = (size_t)(k->view.len - k->offset);
            n++;
        }
        ssize_t r = writev(c->fd, iov, n);
        t->n_writes++;
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) { c->writable = 0; break; }
            c->dead = 1;
            end_reading(c, b, NULL);
            break;
        }
        written += r;
        t->bytes_out += (uint64_t)r;
        /* pops what was written, and empty chunks (a writev of only those returns 0) */
        while (c->out_head) {
            Chunk *k = c->out_head;
            Py_ssize_t left = k->view.len - k->offset;
            if (r < left) { k->offset += r; break; }
            r -= left;
            c->out_head = k->next;
            if (!c->out_head) c->out_tail = NULL;
            batch_release(b, k);
        }
    }
    /* zero-length chunks at the head */
    while (c->out_head && c->out_head->offset >= c->out_head->view.len) {
        Chunk *k = c->out_head;
        c->out_head = k->next;
        if (!c->out_head) c->out_tail = NULL;
        batch_release(b, k);
    }
    return written;
}

static void free_conn(IOThread *t, Conn *c, Batch *b) {
    /* under the mutex */
    uint32_t slot = (uint32_t)(c->id & 0xffffffffu);
    t->slots[slot] = NULL;
    t->free_slots[t->nfree++] = slot;
    t->nconns--;
    if (c->dirty) {  /* requested by Python since this pass began */
        Conn **p = &t->dirty_head;
        while (*p && *p != c) p = &(*p)->next_dirty;
        if (*p) *p = c->next_dirty;
    }
    release_list(b, c->pend_head);
    release_list(b, c->out_head);
    free(c->frame);
    free(c);
}

/* A connection's system calls of a pass (reads, writes), without the mutex. */
static void service_io(IOThread *t, Conn *c, Batch *b) {
    do_read(t, c, b);
    c->written = c->out_head ? do_write(t, c, b) : 0;
    if (c->dead && c->out_head) drop_output(c, b, t);
}

/* Its shared state after them, under the mutex (one section for all the pass's connections):
 * backlog, drain report, close. */
static void service_shared(IOThread *t, Conn *c, Batch *b) {
    if (c->written) c->backlog -= c->written;
    c->written = 0;
    if (c->dead) {
        release_list(b, c->pend_head);
        c->pend_head = c->pend_tail = NULL;
        c->backlog = 0;
    }
    if (c->drain_at >= 0 && c->backlog <= c->drain_at) {
        c->drain_at = -1;
        batch_event(b, EV_DRAINED, c->id, NULL, 0);
    }
    int close_now = c->want_close == 2 || (c->want_close == 1 && (c->dead || (!c->out_head && !c->pend_head)));
    if (close_now) {
        epoll_ctl(t->epfd, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        uint64_t id = c->id;
        free_conn(t, c, b);
        batch_event(b, EV_CLOSED, id, NULL, 0);
        return;
    }
    /* more to read than one pass takes: back next pass (epoll_wait then does not sleep) */
    if (c->readable && !c->paused && !c->eof) todo_add(t, c);
}

/* Under the mutex: the pass's events and released output go to Python; 1 when it must be woken. */
static int publish_locked(IOThread *t, Batch *b) {
    int wake = 0;
    if (b->head) {
        if (t->ev_tail) t->ev_tail->next = b->head; else t->ev_head = b->head;
        t->ev_tail = b->tail;
        wake = 1;
    }
    if (b->rel) {
        Chunk *last = b->rel;
        while (last->next) last = last->next;
        last->next = t->rel_head;
        t->rel_head = b->rel;
        t->rel_bytes += b->rel_bytes;
        if (t->rel_bytes >= RELEASE_WAKE_BYTES) wake = 1;
    }
    b->head = b->tail = NULL; b->rel = NULL; b->rel_bytes = 0;
    return wake;
}

static void publish(IOThread *t, Batch *b) {
    if (!b->head && !b->rel) return;
    pthread_mutex_lock(&t->mu);
    int wake = publish_locked(t, b);
    pthread_mutex_unlock(&t->mu);
    if (wake && atomic_exchange(&t->py_wake_pending, 1) == 0) signal_fd(t->notifyfd);
}

static void *io_main(void *arg) {
    IOThread *t = arg;
    struct epoll_event events[256];
    Batch b = {0};
    while (1) {
        int n = epoll_wait(t->epfd, events, 256, t->todo_head ? 0 : -1);
        if (n < 0 && errno != EINTR) break;
        int woken = 0;
        for (int i = 0; i < n; i++) {
            void *p = events[i].data.ptr;
            uint32_t ev = events[i].events;
            if (p == NULL) { woken = 1; continue; }
            if ((uintptr_t)p <= MAX_LISTENERS) { accept_all(t, t->listeners[(uintptr_t)p - 1], &b); continue; }
            Conn *c = p;
            if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) c->readable = 1;
            if (ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) c->hup = 1;  /* read on to the end */
            if (ev & (EPOLLOUT | EPOLLHUP | EPOLLERR)) c->writable = 1;
            todo_add(t, c);
        }
        if (woken) {
            /* Drained before the flag is cleared, and the commands taken after: a request made
             * after the drain either signals again or is among the commands taken below. */
            drain_fd(t->wakefd);
            atomic_store(&t->io_wake_pending, 0);
            t->n_wakeups++;
        }
        /* commands from Python */
        pthread_mutex_lock(&t->mu);
        int stopping = t->stopping;
        Conn *d = t->dirty_head;
        t->dirty_head = NULL;
        for (; d; d = d->next_dirty) {
            d->dirty = 0;
            if (d->pend_head) {
                if (d->out_tail) d->out_tail->next = d->pend_head; else d->out_head = d->pend_head;
                d->out_tail = d->pend_tail;
                d->pend_head = d->pend_tail = NULL;
            }
            if (d->paused && !d->want_paused) d->readable = 1;  /* resumed: edge-triggered, so look */
            d->paused = d->want_paused;
            todo_add(t, d);
        }
        pthread_mutex_unlock(&t->mu);
        if (stopping) break;
        /* one pass over the connections with work */
        Conn *todo = t->todo_head;
        t->todo_head = NULL;
        Conn *served = NULL;
        while (todo) {
            Conn *c = todo;
            todo = c->next_todo;
            c->queued = 0;
            service_io(t, c, &b);
            c->next_served = served;
            served = c;
        }
        int wake = 0;
        if (served || b.head || b.rel) {
            pthread_mutex_lock(&t->mu);
            while (served) {
                Conn *c = served;
                served = c->next_served;
                service_shared(t, c, &b);  /* may free c */
            }
            wake = publish_locked(t, &b);
            pthread_mutex_unlock(&t->mu);
        }
        if (wake && atomic_exchange(&t->py_wake_pending, 1) == 0) signal_fd(t->notifyfd);
    }
    publish(t, &b);
    return NULL;
}

/* ------------------------------------------------------------------ Frame */

static void Frame_dealloc(Frame *f) {
    free(f->data);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static int Frame_getbuffer(Frame *f, Py_buffer *view, int flags) {
    int r = PyBuffer_FillInfo(view, (PyObject *)f, f->data, f->size, 0, flags);
    if (r == 0) f->exports++;
    return r;
}

static void Frame_releasebuffer(Frame *f, Py_buffer *view) { f->exports--; }

static Py_ssize_t Frame_len(Frame *f) { return f->size; }

static PyObject *Frame_bytes(Frame *f, PyObject *unused) {
    return PyBytes_FromStringAndSize(f->data, f->size);
}

static PyBufferProcs Frame_as_buffer = {(getbufferproc)Frame_getbuffer, (releasebufferproc)Frame_releasebuffer};
static PySequenceMethods Frame_as_sequence = {.sq_length = (lenfunc)Frame_len};
static PyMethodDef Frame_methods[] = {
    {"__bytes__", (PyCFunction)Frame_bytes, METH_NOARGS, "The frame's bytes (a copy)."},
    {NULL}};

static PyTypeObject FrameType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fluvial.broker._netio.Frame",
    .tp_doc = "A request frame (its size prefix removed): a writable buffer the frame owns.",
    .tp_basicsize = sizeof(Frame),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)Frame_dealloc,
    .tp_as_buffer = &Frame_as_buffer,
    .tp_as_sequence = &Frame_as_sequence,
    .tp_methods = Frame_methods,
};

/* ------------------------------------------------------------------ IOThread (Python side) */

static void release_chunks(Chunk *c) {
    while (c) { Chunk *n = c->next; PyBuffer_Release(&c->view); free(c); c = n; }
}

static int IOThread_init(IOThread *t, PyObject *args, PyObject *kw) {
    static char *names[] = {"max_frame_bytes", NULL};
    Py_ssize_t max_frame;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "n", names, &max_frame)) return -1;
    if (t->epfd) { PyErr_SetString(PyExc_RuntimeError, "already initialised"); return -1; }
    if (max_frame < 0) { PyErr_SetString(PyExc_ValueError, "max_frame_bytes < 0"); return -1; }
    t->max_frame = max_frame;
    t->epfd = epoll_create1(EPOLL_CLOEXEC);
    t->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    t->notifyfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    t->scratch = malloc(SCRATCH_BYTES);
    if (t->epfd < 0 || t->wakefd < 0 || t->notifyfd < 0 || !t->scratch) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->wakefd, &ev) < 0) { PyErr_SetFromErrno(PyExc_OSError); return -1; }
    pthread_mutex_init(&t->mu, NULL);
    return 0;
}

static void wake_io(IOThread *t) {
    if (atomic_exchange(&t->io_wake_pending, 1) == 0) signal_fd(t->wakefd);
}

static void mark_dirty(IOThread *t, Conn *c) {
    if (!c->dirty) { c->dirty = 1; c->next_dirty = t->dirty_head; t->dirty_head = c; }
}

static PyObject *stop_thread(IOThread *t) {
    if (t->started && !t->stopped) {
        pthread_mutex_lock(&t->mu);
        t->stopping = 1;
        pthread_mutex_unlock(&t->mu);
        atomic_store(&t->io_wake_pending, 1);
        signal_fd(t->wakefd);
        Py_BEGIN_ALLOW_THREADS
        pthread_join(t->thread, NULL);
        Py_END_ALLOW_THREADS
        t->stopped = 1;
    }
    Py_RETURN_NONE;
}

static void IOThread_dealloc(IOThread *t) {
    PyObject *r = stop_thread(t);
    Py_XDECREF(r);
    /* the thread is gone: free everything left */
    for (uint32_t i = 0; i < t->nslots; i++) {
        Conn *c = t->slots[i];
        if (!c) continue;
        close(c->fd);
        release_chunks(c->pend_head);
        release_chunks(c->out_head);
        free(c->frame);
        free(c);
    }
    free(t->slots);
    free(t->free_slots);
    for (Event *e = t->ev_head; e;) { Event *n = e->next; free(e->data); free(e); e = n; }
    release_chunks(t->rel_head);
    free(t->scratch);
    if (t->epfd > 0) close(t->epfd);
    if (t->wakefd > 0) close(t->wakefd);
    if (t->notifyfd > 0) close(t->notifyfd);
    if (t->epfd) pthread_mutex_destroy(&t->mu);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyObject *IOThread_add_listener(IOThread *t, PyObject *arg) {
    int fd = PyLong_AsLong(arg);
    if (fd < 0 && PyErr_Occurred()) return NULL;
    if (t->started) { PyErr_SetString(PyExc_RuntimeError, "add listeners before start()"); return NULL; }
    if (t->nlisteners >= MAX_LISTENERS) { PyErr_SetString(PyExc_ValueError, "too many listeners"); return NULL; }
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return PyErr_SetFromErrno(PyExc_OSError);
    t->listeners[t->nlisteners++] = fd;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = (void *)(uintptr_t)t->nlisteners};
    if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) { t->nlisteners--; return PyErr_SetFromErrno(PyExc_OSError); }
    Py_RETURN_NONE;
}

static PyObject *IOThread_start(IOThread *t, PyObject *unused) {
    if (t->started) { PyErr_SetString(PyExc_RuntimeError, "already started"); return NULL; }
    int r = pthread_create(&t->thread, NULL, io_main, t);
    if (r != 0) { errno = r; return PyErr_SetFromErrno(PyExc_OSError); }
    t->started = 1;
    Py_RETURN_NONE;
}

static PyObject *IOThread_stop(IOThread *t, PyObject *unused) { return stop_thread(t); }

static PyObject *IOThread_fileno(IOThread *t, PyObject *unused) { return PyLong_FromLong(t->notifyfd); }

static PyObject *IOThread_poll(IOThread *t, PyObject *unused) {
    /* Drained before the flag is cleared, the events taken after (see io_main). */
    drain_fd(t->notifyfd);
    atomic_store(&t->py_wake_pending, 0);
    pthread_mutex_lock(&t->mu);
    Event *e = t->ev_head;
    t->ev_head = t->ev_tail = NULL;
    Chunk *rel = t->rel_head;
    t->rel_head = NULL;
    t->rel_bytes = 0;
    pthread_mutex_unlock(&t->mu);
    release_chunks(rel);
    PyObject *out = PyList_New(0);
    if (!out) goto fail;
    while (e) {
        Event *next = e->next;
        PyObject *payload;
        if (e->kind == EV_FRAME) {
            Frame *f = PyObject_New(Frame, &FrameType);
            if (!f) goto fail;
            f->data = e->data; f->size = e->size; f->exports = 0;
            e->data = NULL;
            payload = (PyObject *)f;
        } else if (e->data) {
            payload = PyUnicode_DecodeUTF8(e->data, strlen(e->data), "replace");
            if (!payload) goto fail;
        } else {
            payload = Py_NewRef(Py_None);
        }
        PyObject *item = Py_BuildValue("(iKN)", e->kind, (unsigned long long)e->id, payload);
        if (!item || PyList_Append(out, item) < 0) { Py_XDECREF(item); goto fail; }
        Py_DECREF(item);
        free(e->data);
        free(e);
        e = next;
    }
    return out;
fail:
    /* frames not handed over are dropped; the caller sees the error */
    while (e) { Event *n = e->next; free(e->data); free(e); e = n; }
    Py_XDECREF(out);
    return NULL;
}

static int add_chunk(Chunk **head, Chunk **tail, PyObject *obj, Py_ssize_t *bytes) {
    Chunk *k = malloc(sizeof *k);
    if (!k) { PyErr_NoMemory(); return -1; }
    if (PyObject_GetBuffer(obj, &k->view, PyBUF_SIMPLE) < 0) { free(k); return -1; }
    k->offset = 0;
    k->next = NULL;
    if (*tail) (*tail)->next = k; else *head = k;
    *tail = k;
    *bytes += k->view.len;
    return 0;
}

static PyObject *IOThread_send(IOThread *t, PyObject *args) {
    unsigned long long id;
    PyObject *data;
    if (!PyArg_ParseTuple(args, "KO", &id, &data)) return NULL;
    Chunk *head = NULL, *tail = NULL;
    Py_ssize_t bytes = 0;
    if (PyList_CheckExact(data) || PyTuple_CheckExact(data)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(data);
        PyObject **items = PySequence_Fast_ITEMS(data);
        for (Py_ssize_t i = 0; i < n; i++)
            if (add_chunk(&head, &tail, items[i], &bytes) < 0) { release_chunks(head); return NULL; }
    } else if (add_chunk(&head, &tail, data, &bytes) < 0) {
        return NULL;
    }
    pthread_mutex_lock(&t->mu);
    Conn *c = lookup(t, id);
    if (!c || c->want_close || t->stopping) {
        pthread_mutex_unlock(&t->mu);
        release_chunks(head);
        return PyLong_FromLong(-1);
    }
    if (head) {
        if (c->pend_tail) c->pend_tail->next = head; else c->pend_head = head;
        c->pend_tail = tail;
        c->backlog += bytes;
    }
    Py_ssize_t backlog = c->backlog;
    mark_dirty(t, c);
    pthread_mutex_unlock(&t->mu);
    wake_io(t);
    return PyLong_FromSsize_t(backlog);
}

static PyObject *IOThread_send_many(IOThread *t, PyObject *args) {
    PyObject *items;
    Py_ssize_t threshold;
    if (!PyArg_ParseTuple(args, "O!n", &PyList_Type, &items, &threshold)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items);
    if (n == 0) return PyList_New(0);
    /* the buffers first (with the GIL, outside the mutex): one chunk list per item */
    Chunk **heads = calloc((size_t)n, sizeof *heads), **tails = calloc((size_t)n, sizeof *tails);
    Py_ssize_t *sizes = calloc((size_t)n, sizeof *sizes);
    unsigned long long *ids = calloc((size_t)n, sizeof *ids);
    PyObject *over = NULL;
    if (!heads || !tails || !sizes || !ids) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        PyObject *data;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(PyExc_TypeError, "send_many takes a list of (id, data)");
            goto done;
        }
        ids[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, 0));
        if (PyErr_Occurred()) goto done;
        data = PyTuple_GET_ITEM(item, 1);
        if (PyList_CheckExact(data) || PyTuple_CheckExact(data)) {
            Py_ssize_t m = PySequence_Fast_GET_SIZE(data);
            PyObject **parts = PySequence_Fast_ITEMS(data);
            for (Py_ssize_t k = 0; k < m; k++)
                if (add_chunk(&heads[i], &tails[i], parts[k], &sizes[i]) < 0) goto done;
        } else if (add_chunk(&heads[i], &tails[i], data, &sizes[i]) < 0) {
            goto done;
        }
    }
    over = PyList_New(0);
    if (!over) goto done;
    int any = 0;
    pthread_mutex_lock(&t->mu);
    for (Py_ssize_t i = 0; i < n; i++) {
        Conn *c = lookup(t, ids[i]);
        if (!c || c->want_close || t->stopping) continue;  /* gone: released below */
        if (heads[i]) {
            if (c->pend_tail) c->pend_tail->next = heads[i]; else c->pend_head = heads[i];
            c->pend_tail = tails[i];
            c->backlog += sizes[i];
            heads[i] = NULL;
        }
        mark_dirty(t, c);
        any = 1;
        if (c->backlog > threshold) sizes[i] = -1;  /* reported below, outside the mutex */
    }
    pthread_mutex_unlock(&t->mu);
    if (any) wake_io(t);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (sizes[i] == -1) {
            PyObject *id = PyLong_FromUnsignedLongLong(ids[i]);
            if (!id || PyList_Append(over, id) < 0) { Py_XDECREF(id); Py_CLEAR(over); break; }
            Py_DECREF(id);
        }
    }
done:
    if (heads) for (Py_ssize_t i = 0; i < n; i++) release_chunks(heads[i]);
    free(heads); free(tails); free(sizes); free(ids);
    return over;
}

static PyObject *IOThread_pause(IOThread *t, PyObject *args) {
    unsigned long long id;
    int paused;
    if (!PyArg_ParseTuple(args, "Kp", &id, &paused)) return NULL;
    pthread_mutex_lock(&t->mu);
    Conn *c = lookup(t, id);
    int found = c != NULL;
    if (c && c->want_paused != paused) {
        c->want_paused = paused;
        mark_dirty(t, c);
    } else {
        c = NULL;
    }
    pthread_mutex_unlock(&t->mu);
    if (c) wake_io(t);
    return PyBool_FromLong(found);
}

static PyObject *IOThread_watch_drain(IOThread *t, PyObject *args) {
    unsigned long long id;
    Py_ssize_t at;
    if (!PyArg_ParseTuple(args, "Kn", &id, &at)) return NULL;
    pthread_mutex_lock(&t->mu);
    Conn *c = lookup(t, id);
    if (c) { c->drain_at = at; mark_dirty(t, c); }
    pthread_mutex_unlock(&t->mu);
    if (c) wake_io(t);
    return PyBool_FromLong(c != NULL);
}

static PyObject *IOThread_backlog(IOThread *t, PyObject *args) {
    unsigned long long id;
    if (!PyArg_ParseTuple(args, "K", &id)) return NULL;
    pthread_mutex_lock(&t->mu);
    Conn *c = lookup(t, id);
    Py_ssize_t backlog = c ? c->backlog : -1;
    pthread_mutex_unlock(&t->mu);
    return PyLong_FromSsize_t(backlog);
}

static PyObject *IOThread_close(IOThread *t, PyObject *args) {
    unsigned long long id;
    int flush = 1;
    if (!PyArg_ParseTuple(args, "K|p", &id, &flush)) return NULL;
    pthread_mutex_lock(&t->mu);
    Conn *c = lookup(t, id);
    if (c && (c->want_close == 0 || (!flush && c->want_close == 1))) {
        c->want_close = flush ? 1 : 2;
        mark_dirty(t, c);
    } else {
        c = NULL;
    }
    pthread_mutex_unlock(&t->mu);
    if (c) wake_io(t);
    return PyBool_FromLong(c != NULL);
}

static PyObject *IOThread_stats(IOThread *t, PyObject *unused) {
    pthread_mutex_lock(&t->mu);
    Py_ssize_t conns = t->nconns;
    pthread_mutex_unlock(&t->mu);
    return Py_BuildValue("{s:n,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "connections", conns,
                         "accepted", (unsigned long long)t->n_accepted, "frames", (unsigned long long)t->n_frames,
                         "wakeups", (unsigned long long)t->n_wakeups, "reads", (unsigned long long)t->n_reads,
                         "writes", (unsigned long long)t->n_writes, "bytes_in", (unsigned long long)t->bytes_in,
                         "bytes_out", (unsigned long long)t->bytes_out);
}

static PyMethodDef IOThread_methods[] = {
    {"add_listener", (PyCFunction)IOThread_add_listener, METH_O,
     "add_listener(fd): accept connections on this listening socket (before start)."},
    {"start", (PyCFunction)IOThread_start, METH_NOARGS, "Start the I/O thread."},
    {"stop", (PyCFunction)IOThread_stop, METH_NOARGS,
     "Stop the thread (connections stay open until the object is freed)."},
    {"fileno", (PyCFunction)IOThread_fileno, METH_NOARGS,
     "The descriptor that becomes readable when poll() has something."},
    {"poll", (PyCFunction)IOThread_poll, METH_NOARGS,
     "Events since the last call: a list of (kind, connection id, payload)."},
    {"send", (PyCFunction)IOThread_send, METH_VARARGS,
     "send(id, buffer or list of buffers): queue output; returns the bytes not yet written (-1: gone)."},
    {"send_many", (PyCFunction)IOThread_send_many, METH_VARARGS,
     "send_many([(id, data), ...], threshold): queue output of many connections (one lock, one wake-up); "
     "returns the ids whose unwritten output is above threshold."},
    {"pause", (PyCFunction)IOThread_pause, METH_VARARGS, "pause(id, paused): stop or resume reading."},
    {"watch_drain", (PyCFunction)IOThread_watch_drain, METH_VARARGS,
     "watch_drain(id, bytes): one DRAINED event once at most this much output is unwritten."},
    {"backlog", (PyCFunction)IOThread_backlog, METH_VARARGS, "backlog(id): bytes queued, not yet written."},
    {"close", (PyCFunction)IOThread_close, METH_VARARGS,
     "close(id, flush=True): close once the output is written (or at once); a CLOSED event follows."},
    {"stats", (PyCFunction)IOThread_stats, METH_NOARGS, "Counters of the I/O thread."},
    {NULL}};

static PyTypeObject IOThreadType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fluvial.broker._netio.IOThread",
    .tp_doc = "IOThread(max_frame_bytes): a thread doing a Kafka listener's socket I/O.",
    .tp_basicsize = sizeof(IOThread),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)IOThread_init,
    .tp_dealloc = (destructor)IOThread_dealloc,
    .tp_methods = IOThread_methods,
};

static struct PyModuleDef netio_module = {PyModuleDef_HEAD_INIT, "_netio",
                                          "The Kafka listener's compiled I/O thread.", -1, NULL};

PyMODINIT_FUNC PyInit__netio(void) {
    if (PyType_Ready(&FrameType) < 0 || PyType_Ready(&IOThreadType) < 0) return NULL;
    PyObject *m = PyModule_Create(&netio_module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "IOThread", (PyObject *)&IOThreadType) < 0 ||
        PyModule_AddObjectRef(m, "Frame", (PyObject *)&FrameType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "ACCEPTED", EV_ACCEPTED);
    PyModule_AddIntConstant(m, "FRAME", EV_FRAME);
    PyModule_AddIntConstant(m, "EOF", EV_EOF);
    PyModule_AddIntConstant(m, "DRAINED", EV_DRAINED);
    PyModule_AddIntConstant(m, "CLOSED", EV_CLOSED);
    return m;
}
