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
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define MAX_FILES 8

typedef struct {
    PyObject_HEAD
    pthread_t thread;
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    clockid_t cpu_clock;
    double cpu_at_exit; /* the thread's CPU once it has ended (its clock is gone) */
    int started, stop, changed, nfiles;
    int fds[MAX_FILES];
    int64_t period_ns;
    int64_t *ring; /* capacity records of (t_ns, value x nfiles) */
    Py_ssize_t capacity, head, count;
    unsigned long long readings, lost, errors;
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

static void *run(void *arg) {
    Stream *s = arg;
    int64_t next = now_ns();
    pthread_mutex_lock(&s->mutex);
    while (!s->stop) {
        pthread_mutex_unlock(&s->mutex);
        int64_t values[MAX_FILES];
        int ok = 1;
        for (int i = 0; i < s->nfiles && ok; i++) ok = read_value(s->fds[i], &values[i]);
        int64_t t = now_ns();
        pthread_mutex_lock(&s->mutex);
        s->readings++;
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
    pthread_mutex_init(&s->mutex, NULL);
    int rc = pthread_create(&s->thread, NULL, run, s);
    if (rc != 0) {
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    pthread_getcpuclockid(s->thread, &s->cpu_clock);
    s->started = 1;
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
    if (period != s->period_ns) {
        s->period_ns = period;
        s->changed = 1;
        pthread_cond_signal(&s->cond);
    }
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

/* (readings, lost, errors) since the start. */
static PyObject *Stream_stats(Stream *s, PyObject *unused) {
    pthread_mutex_lock(&s->mutex);
    unsigned long long readings = s->readings, lost = s->lost, errors = s->errors;
    pthread_mutex_unlock(&s->mutex);
    return Py_BuildValue("(KKK)", readings, lost, errors);
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
    {"drain", (PyCFunction)Stream_drain, METH_NOARGS, "The readings since the last drain."},
    {"cpu_s", (PyCFunction)Stream_cpu_s, METH_NOARGS, "The thread's CPU clock, in s."},
    {"stats", (PyCFunction)Stream_stats, METH_NOARGS, "(readings, lost, errors)."},
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
