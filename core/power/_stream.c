/* The board input read at the sensor's rate by a native thread (power/native.py).
 *
 * A Python thread's wake costs 90 to 200 us of CPU on the VM of docs/performance.md,
 * C's nanosleep 25: at the power reader's rates the wake is the reader's cost. This
 * thread reads a few sysfs value files (held open by Python; pread at offset 0 shows
 * the value anew) at a rate Python can change at once, and keeps the raw integers with
 * their CLOCK_MONOTONIC time (time.monotonic's clock) in a ring, which Python drains
 * at each edge. It never takes the GIL. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_FILES 8
/* The lateness of the last LATE_KEEP readings (their time against when they were due),
 * for benchmarks/power_reader.py's lag under load: a second of readings at 1 kHz and
 * more, taken at least once a second. */
#define LATE_KEEP 4096
/* The nice value the thread tries where it may not be real-time (and up from it). */
#define AHEAD_NICE (-10)

typedef struct {
    PyObject_HEAD
    pthread_t thread;
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    clockid_t cpu_clock;
    double cpu_at_exit; /* the thread's CPU once it has ended (its clock is gone) */
    int started, stop, changed, nfiles;
    int ahead; /* AHEAD_FIFO, a nice value below 0 it runs at, or 0: as its process */
    int ready; /* the thread has set ahead: Stream() returns then */
    int fds[MAX_FILES];
    int64_t period_ns;
    int64_t until_ns, then_ns; /* at until_ns (0: never) the period becomes then_ns */
    int64_t *ring; /* capacity records of (t_ns, value x nfiles) */
    Py_ssize_t capacity, head, count;
    unsigned long long readings, lost, errors;
    int64_t late[LATE_KEEP]; /* ns, a ring; late_count of them since the last take */
    Py_ssize_t late_head, late_count;
} Stream;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static struct timespec to_timespec(int64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
    return ts;
}

static int read_value(int fd, int64_t *value) {
    char buf[32];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return 0;
    buf[n] = '\0';
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (end == buf || errno) return 0;
    *value = v;
    return 1;
}

#define AHEAD_FIFO 1

/* Ahead of the work it measures where the process may (CAP_SYS_NICE, or the rlimits
 * RLIMIT_RTPRIO / RLIMIT_NICE): a busy loop per core delays a reading of the process's
 * own priority by more than a period at 100 Hz (benchmarks/power_reader.py). First
 * SCHED_FIFO at the lowest real-time priority: it preempts any ordinary thread at once,
 * for the few us a reading takes (the kernel's real-time throttling bounds it all the
 * same); else the lowest nice value from AHEAD_NICE up that it may take. */
static int run_ahead(void) {
    struct sched_param param = {.sched_priority = 1};
    if (pthread_setschedparam(pthread_self(), SCHED_FIFO, &param) == 0) return AHEAD_FIFO;
#ifdef __linux__ /* a thread's own nice value: Linux's */
    id_t tid = (id_t)syscall(SYS_gettid);
    for (int nice = AHEAD_NICE; nice < 0; nice++) {
        if (setpriority(PRIO_PROCESS, tid, nice) == 0) return nice;
    }
#endif
    return 0;
}

static void *run(void *arg) {
    Stream *s = arg;
    int ahead = run_ahead();
    int64_t next = now_ns();
    pthread_mutex_lock(&s->mutex);
    s->ahead = ahead;
    s->ready = 1;
    pthread_cond_broadcast(&s->cond);
    while (!s->stop) {
        pthread_mutex_unlock(&s->mutex);
        int64_t values[MAX_FILES];
        int ok = 1;
        for (int i = 0; i < s->nfiles && ok; i++) ok = read_value(s->fds[i], &values[i]);
        int64_t t = now_ns();
        pthread_mutex_lock(&s->mutex);
        s->readings++;
        s->late[s->late_head++ % LATE_KEEP] = t - next; /* next: when this one was due */
        if (s->late_count < LATE_KEEP) s->late_count++;
        if (!ok) {
            s->errors++;
        } else {
            int64_t *slot = s->ring + (s->head % s->capacity) * (1 + s->nfiles);
            slot[0] = t;
            for (int i = 0; i < s->nfiles; i++) slot[1 + i] = values[i];
            s->head++;
            if (s->count < s->capacity) s->count++;
            else s->lost++; /* the oldest is overwritten: Python drained too late */
        }
        if (s->until_ns && t >= s->until_ns) { /* the window's rate ends: no wake needed */
            s->period_ns = s->then_ns;
            s->until_ns = 0;
        }
        next += s->period_ns;
        if (next < t - s->period_ns) next = t + s->period_ns; /* skip missed, never burst */
        struct timespec deadline = to_timespec(next);
        while (!s->stop && !s->changed) {
            if (pthread_cond_timedwait(&s->cond, &s->mutex, &deadline) == ETIMEDOUT) break;
        }
        if (s->changed) { /* a new rate: read now, then at it */
            s->changed = 0;
            next = now_ns();
        }
    }
    struct timespec cpu;
    if (clock_gettime(s->cpu_clock, &cpu) == 0) s->cpu_at_exit = cpu.tv_sec + cpu.tv_nsec / 1e9;
    pthread_mutex_unlock(&s->mutex);
    return NULL;
}

static int64_t period_of(double hz) { return (int64_t)(1e9 / hz); }

static int Stream_init(Stream *s, PyObject *args, PyObject *kwds) {
    static char *keywords[] = {"fds", "hz", "capacity", NULL};
    PyObject *fds;
    double hz;
    Py_ssize_t capacity = 32768;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!d|n", keywords, &PyTuple_Type, &fds, &hz,
                                     &capacity))
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(fds);
    if (s->ring != NULL) { /* its ring, mutex and thread are set up once */
        PyErr_SetString(PyExc_RuntimeError, "a stream is set up once: make a new one");
        return -1;
    }
    if (n < 1 || n > MAX_FILES) {
        PyErr_Format(PyExc_ValueError, "a stream reads 1 to %d files, got %zd", MAX_FILES, n);
        return -1;
    }
    if (!(hz >= 0.1 && hz <= 10000) || capacity < 2) {
        PyErr_SetString(PyExc_ValueError, "hz must be from 0.1 to 10000, capacity at least 2");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int fd = PyLong_AsLong(PyTuple_GET_ITEM(fds, i));
        if (fd == -1 && PyErr_Occurred()) return -1;
        s->fds[i] = fd;
    }
    s->nfiles = (int)n;
    s->capacity = capacity;
    s->ring = PyMem_RawCalloc((size_t)capacity * (1 + n), sizeof(int64_t));
    if (s->ring == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    s->period_ns = period_of(hz);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cond, &attr);
    pthread_condattr_destroy(&attr);
    /* Priority inheritance: a drain holding the lock, preempted by the work, runs at
     * the reader's priority until it lets go, so the reader never waits behind it. */
    pthread_mutexattr_t mutex_attr;
    pthread_mutexattr_init(&mutex_attr);
    pthread_mutexattr_setprotocol(&mutex_attr, PTHREAD_PRIO_INHERIT);
    pthread_mutex_init(&s->mutex, &mutex_attr);
    pthread_mutexattr_destroy(&mutex_attr);
    int rc = pthread_create(&s->thread, NULL, run, s);
    if (rc != 0) {
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    pthread_getcpuclockid(s->thread, &s->cpu_clock);
    s->started = 1;
    Py_BEGIN_ALLOW_THREADS /* until it says how it runs (a few us) */
    pthread_mutex_lock(&s->mutex);
    while (!s->ready) pthread_cond_wait(&s->cond, &s->mutex);
    pthread_mutex_unlock(&s->mutex);
    Py_END_ALLOW_THREADS
    return 0;
}

static void stop_thread(Stream *s) {
    if (!s->started) return;
    pthread_mutex_lock(&s->mutex);
    s->stop = 1;
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->mutex);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(s->thread, NULL);
    Py_END_ALLOW_THREADS
    s->started = 0;
}

static PyObject *Stream_set_hz(Stream *s, PyObject *arg) {
    double hz = PyFloat_AsDouble(arg);
    if (hz == -1.0 && PyErr_Occurred()) return NULL;
    if (!(hz >= 0.1 && hz <= 10000)) {
        PyErr_SetString(PyExc_ValueError, "hz must be from 0.1 to 10000");
        return NULL;
    }
    pthread_mutex_lock(&s->mutex);
    int64_t period = period_of(hz);
    s->until_ns = 0;
    if (period != s->period_ns) {
        s->period_ns = period;
        s->changed = 1;
        pthread_cond_signal(&s->cond);
    }
    pthread_mutex_unlock(&s->mutex);
    Py_RETURN_NONE;
}

/* set_rate(hz, until, then_hz): at hz until the monotonic instant until (s), then at
 * then_hz, the thread changing by itself at its first reading from until on. It is
 * woken (a real-time thread preempting the caller, and the kernel's chance to run
 * another task before it resumes) only where the rate now must get faster; a slower
 * one, or the same with a new until, takes effect at its next reading. */
static PyObject *Stream_set_rate(Stream *s, PyObject *args) {
    double hz, until, then_hz;
    if (!PyArg_ParseTuple(args, "ddd", &hz, &until, &then_hz)) return NULL;
    if (!(hz >= 0.1 && hz <= 10000) || !(then_hz >= 0.1 && then_hz <= 10000)) {
        PyErr_SetString(PyExc_ValueError, "hz must be from 0.1 to 10000");
        return NULL;
    }
    pthread_mutex_lock(&s->mutex);
    int64_t period = period_of(hz);
    s->then_ns = period_of(then_hz);
    s->until_ns = until > 0 ? (int64_t)(until * 1e9) : 0;
    if (period < s->period_ns) {
        s->changed = 1;
        pthread_cond_signal(&s->cond);
    }
    s->period_ns = period;
    pthread_mutex_unlock(&s->mutex);
    Py_RETURN_NONE;
}

/* [(monotonic s, (value, ...)), ...] oldest first, and the ring emptied. */
static PyObject *Stream_drain(Stream *s, PyObject *unused) {
    if (s->ring == NULL) return PyList_New(0);
    Py_ssize_t width = 1 + s->nfiles;
    pthread_mutex_lock(&s->mutex);
    Py_ssize_t count = s->count, first = s->head - count;
    int64_t *copy = count ? PyMem_RawMalloc((size_t)count * width * sizeof(int64_t)) : NULL;
    if (copy != NULL) {
        for (Py_ssize_t k = 0; k < count; k++) {
            int64_t *slot = s->ring + ((first + k) % s->capacity) * width;
            for (Py_ssize_t i = 0; i < width; i++) copy[k * width + i] = slot[i];
        }
        s->count = 0;
    }
    pthread_mutex_unlock(&s->mutex);
    if (count && copy == NULL) return PyErr_NoMemory();
    PyObject *out = PyList_New(count);
    for (Py_ssize_t k = 0; out != NULL && k < count; k++) {
        int64_t *rec = copy + k * width;
        PyObject *values = PyTuple_New(s->nfiles);
        PyObject *item = values ? Py_BuildValue("(dN)", rec[0] / 1e9, values) : NULL;
        if (item == NULL) {
            Py_CLEAR(out);
            break;
        }
        for (int i = 0; i < s->nfiles; i++) PyTuple_SET_ITEM(values, i, PyLong_FromLongLong(rec[1 + i]));
        PyList_SET_ITEM(out, k, item);
    }
    PyMem_RawFree(copy);
    return out;
}

static PyObject *Stream_cpu_s(Stream *s, PyObject *unused) {
    struct timespec ts;
    if (!s->started || clock_gettime(s->cpu_clock, &ts) != 0) return PyFloat_FromDouble(s->cpu_at_exit);
    return PyFloat_FromDouble(ts.tv_sec + ts.tv_nsec / 1e9);
}

/* [s, ...]: how late each reading since the last call was (its time against when it
 * was due), oldest first; the last LATE_KEEP at most. */
static PyObject *Stream_lateness(Stream *s, PyObject *unused) {
    int64_t copy[LATE_KEEP];
    pthread_mutex_lock(&s->mutex);
    Py_ssize_t count = s->late_count, first = s->late_head - count;
    for (Py_ssize_t k = 0; k < count; k++) copy[k] = s->late[(first + k) % LATE_KEEP];
    s->late_count = 0;
    pthread_mutex_unlock(&s->mutex);
    PyObject *out = PyList_New(count);
    for (Py_ssize_t k = 0; out != NULL && k < count; k++) {
        PyObject *late = PyFloat_FromDouble(copy[k] / 1e9);
        if (late == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, k, late);
    }
    return out;
}

/* (readings, lost, errors) since the start. */
static PyObject *Stream_stats(Stream *s, PyObject *unused) {
    pthread_mutex_lock(&s->mutex);
    unsigned long long readings = s->readings, lost = s->lost, errors = s->errors;
    pthread_mutex_unlock(&s->mutex);
    return Py_BuildValue("(KKK)", readings, lost, errors);
}

/* How the thread runs ahead of its process's work: "fifo", "nice -N", or "" (as its
 * process). */
static PyObject *Stream_ahead(Stream *s, PyObject *unused) {
    pthread_mutex_lock(&s->mutex);
    int ahead = s->ahead;
    pthread_mutex_unlock(&s->mutex);
    if (ahead == AHEAD_FIFO) return PyUnicode_FromString("fifo");
    if (ahead < 0) return PyUnicode_FromFormat("nice %d", ahead);
    return PyUnicode_FromString("");
}

static PyObject *Stream_close(Stream *s, PyObject *unused) {
    stop_thread(s);
    Py_RETURN_NONE;
}

static void Stream_dealloc(Stream *s) {
    stop_thread(s);
    PyMem_RawFree(s->ring);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyMethodDef Stream_methods[] = {
    {"set_hz", (PyCFunction)Stream_set_hz, METH_O, "Read at this rate from now on."},
    {"set_rate", (PyCFunction)Stream_set_rate, METH_VARARGS,
     "set_rate(hz, until, then_hz): at hz until the monotonic until (0: for good), then at then_hz; woken only to go faster."},
    {"drain", (PyCFunction)Stream_drain, METH_NOARGS, "The readings since the last drain."},
    {"cpu_s", (PyCFunction)Stream_cpu_s, METH_NOARGS, "The thread's CPU clock, in s."},
    {"stats", (PyCFunction)Stream_stats, METH_NOARGS, "(readings, lost, errors)."},
    {"ahead", (PyCFunction)Stream_ahead, METH_NOARGS, "fifo, nice -N or empty: its priority."},
    {"lateness", (PyCFunction)Stream_lateness, METH_NOARGS, "Each reading's delay since the last call, s."},
    {"close", (PyCFunction)Stream_close, METH_NOARGS, "Stop the thread (the files stay open)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StreamType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "edgewatt.core.power._stream.Stream",
    .tp_basicsize = sizeof(Stream),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Stream(fds, hz, capacity=32768): sysfs value files read at hz by a native thread.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Stream_init,
    .tp_dealloc = (destructor)Stream_dealloc,
    .tp_methods = Stream_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_stream", NULL, -1, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__stream(void) {
    if (PyType_Ready(&StreamType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&StreamType);
    if (PyModule_AddObject(m, "Stream", (PyObject *)&StreamType) < 0) {
        Py_DECREF(&StreamType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
