/* The compiled hot path: what the producer does once per record.
 *
 * - RecordsCore: the record encoder of RecordBatchBuilder (aioprod/protocol/records/builder.py),
 *   its base class when this module is built. Same fields, same bytes, same errors as the
 *   pure-Python _PyRecordsCore there (tests/protocol/records compare the two byte for byte).
 * - murmur2 / partition_for_key: Kafka's key hash (aioprod/producer/partitioner.py).
 *
 * Everything here has a pure-Python twin that stays the reference and the fallback: the module
 * is optional at build time, and AIOPROD_PURE_PYTHON=1 turns it off at run time
 * (aioprod/_compiled.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* -- varints ---------------------------------------------------------------------------------- */

static inline int
uvarint_size(uint64_t value)
{
    int size = 1;
    while (value > 0x7F) {
        value >>= 7;
        size++;
    }
    return size;
}

static inline char *
put_uvarint(char *out, uint64_t value)
{
    while (value > 0x7F) {
        *out++ = (char)((value & 0x7F) | 0x80);
        value >>= 7;
    }
    *out++ = (char)value;
    return out;
}

static inline uint64_t
zigzag(int64_t value)
{
    return ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
}

/* -- RecordsCore ------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *buf;     /* bytearray: the records section so far */
    PyObject *section; /* None, or the closed (compressed) section: no more appends */
    long long count;
    long long base_ts;
    long long max_ts;
    long long limit; /* records-section bytes that fit; -1 once closed */
    char full;
} RecordsCore;

/* One header, resolved for encoding. */
typedef struct {
    PyObject *pair; /* keeps the name and value alive while they are encoded */
    const char *name;
    Py_ssize_t name_len;
    Py_buffer value; /* value.obj == NULL: null value */
} Header;

static int
timestamp_arg(PyObject *arg, long long *out)
{
    int overflow = 0;
    long long value;
    if (!PyLong_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "timestamp must be an int, not %.100s", Py_TYPE(arg)->tp_name);
        return -1;
    }
    value = PyLong_AsLongLongAndOverflow(arg, &overflow);
    if (value == -1 && PyErr_Occurred())
        return -1;
    if (overflow || value < 0) {
        PyErr_Format(PyExc_ValueError, "timestamp must be in [0, 2**63), got %S", arg);
        return -1;
    }
    *out = value;
    return 0;
}

static void
release_headers(Header *headers, Py_ssize_t count)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        if (headers[i].value.obj != NULL)
            PyBuffer_Release(&headers[i].value);
        Py_XDECREF(headers[i].pair);
    }
    PyMem_Free(headers);
}

/* ``items`` as a tuple (a new reference; NULL with TypeError ``message`` if not iterable).
 * Not a list: the pointers taken into it must outlive Python code run meanwhile (the next
 * pair's __iter__), which could empty or rebind a list. */
static PyObject *
as_tuple(PyObject *items, const char *message)
{
    PyObject *seq = PySequence_Fast(items, message), *tuple;
    if (seq == NULL || PyTuple_CheckExact(seq))
        return seq;
    tuple = PySequence_Tuple(seq);
    Py_DECREF(seq);
    return tuple;
}

/* Resolve ``headers`` (an iterable of (str, bytes-like | None) pairs) into ``*out``; returns the
 * number of headers and adds their encoded size to ``*size``, or -1 with an exception set. */
static Py_ssize_t
resolve_headers(PyObject *headers, Header **out, Py_ssize_t *size)
{
    PyObject *seq, *item;
    Py_ssize_t count, i;
    Header *list;

    *out = NULL;
    seq = as_tuple(headers, "headers must be an iterable of (str, bytes | None) pairs");
    if (seq == NULL)
        return -1;
    count = PySequence_Fast_GET_SIZE(seq);
    if (count == 0) {
        Py_DECREF(seq);
        *size += 1;
        return 0;
    }
    list = PyMem_Calloc((size_t)count, sizeof(Header));
    if (list == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    *size += uvarint_size((uint64_t)count << 1);
    for (i = 0; i < count; i++) {
        PyObject *name, *value, *pair;
        item = PySequence_Fast_GET_ITEM(seq, i);
        /* As Python's "for name, value in headers": any iterable of two (TypeError if not
         * iterable, ValueError if not two items). */
        pair = as_tuple(item, "cannot unpack a header that is not a pair");
        if (pair == NULL)
            goto fail;
        list[i].pair = pair;
        if (PySequence_Fast_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_ValueError, "each header must be a (str, bytes | None) pair");
            goto fail;
        }
        name = PySequence_Fast_GET_ITEM(pair, 0);
        value = PySequence_Fast_GET_ITEM(pair, 1);
        if (!PyUnicode_Check(name)) {
            PyErr_Format(PyExc_TypeError, "header key must be str, not %.100s", Py_TYPE(name)->tp_name);
            goto fail;
        }
        list[i].name = PyUnicode_AsUTF8AndSize(name, &list[i].name_len);
        if (list[i].name == NULL)
            goto fail;
        *size += uvarint_size((uint64_t)list[i].name_len << 1) + list[i].name_len;
        if (value == Py_None) {
            *size += 1;
        }
        else {
            if (PyObject_GetBuffer(value, &list[i].value, PyBUF_SIMPLE) < 0)
                goto fail;
            *size += uvarint_size((uint64_t)list[i].value.len << 1) + list[i].value.len;
        }
    }
    Py_DECREF(seq); /* each entry's pair keeps its name (and the name's cached UTF-8) and value */
    *out = list;
    return count;
fail:
    Py_DECREF(seq);
    release_headers(list, count); /* calloc'd: entries not reached hold no buffer */
    return -1;
}

/* Full once not even the smallest record (null key and value, no headers, the first record's
 * timestamp) fits: the accumulator then sends the batch without waiting for its linger. Kept
 * as a flag, not computed when asked, because the sender asks of every queued batch every
 * round. */
static void
note_if_full(RecordsCore *self)
{
    if (PyByteArray_GET_SIZE(self->buf) + 6 + (Py_ssize_t)uvarint_size((uint64_t)self->count << 1) > self->limit)
        self->full = 1;
}

/* Resize ``self->buf`` to ``size`` bytes. Growing, it at least doubles its allocation (up to
 * the batch's limit): bytearray grows by an eighth, and a batch filled a record at a time
 * would otherwise be reallocated (and often copied) some forty times on its way to 16 KiB. */
static int
grow(RecordsCore *self, Py_ssize_t size)
{
    Py_ssize_t allocated = ((PyByteArrayObject *)self->buf)->ob_alloc;
    if (size >= allocated) {
        Py_ssize_t capacity = 2 * allocated;
        if (capacity > self->limit)
            capacity = self->limit;
        /* Shrinking from ``capacity`` back to ``size`` (at least half of it) keeps the
         * allocation: bytearray only gives memory back below half. */
        if (capacity > size && PyByteArray_Resize(self->buf, capacity) < 0)
            return -1;
    }
    return PyByteArray_Resize(self->buf, size);
}

static int
check_open(RecordsCore *self)
{
    if (self->buf == NULL || !PyByteArray_Check(self->buf)) {
        PyErr_SetString(PyExc_TypeError, "the builder's buffer is not a bytearray");
        return -1;
    }
    return 0;
}

/* Encode one record at the end of ``self->buf``; returns 1 if appended, 0 if it does not fit
 * (the builder is then full), -1 on error. Key and value are bytes-like or None. */
static int
encode_record(RecordsCore *self, uint64_t ts_varint, PyObject *key, PyObject *value, PyObject *headers)
{
    Py_buffer key_view = {0}, value_view = {0};
    Header *resolved = NULL;
    Py_ssize_t header_count = 0, body = 1 /* attributes */, total, start;
    long long count = self->count;
    uint64_t offset_varint = (uint64_t)count << 1;
    char *out;
    int result = -1;

    if (key != Py_None && PyObject_GetBuffer(key, &key_view, PyBUF_SIMPLE) < 0)
        return -1;
    if (value != Py_None && PyObject_GetBuffer(value, &value_view, PyBUF_SIMPLE) < 0)
        goto done;
    body += uvarint_size(ts_varint) + uvarint_size(offset_varint);
    body += key_view.obj ? uvarint_size((uint64_t)key_view.len << 1) + key_view.len : 1;
    body += value_view.obj ? uvarint_size((uint64_t)value_view.len << 1) + value_view.len : 1;
    if (headers != Py_None && headers != NULL) {
        header_count = resolve_headers(headers, &resolved, &body);
        if (header_count < 0)
            goto done;
    }
    else {
        body += 1;
    }
    /* Reading the headers ran Python code, which may have replaced the buffer or appended. */
    if (check_open(self) < 0)
        goto done;
    if (self->count != count) {
        PyErr_SetString(PyExc_RuntimeError, "a record was appended to the batch while another's headers were read");
        goto done;
    }
    total = uvarint_size((uint64_t)body << 1) + body;
    start = PyByteArray_GET_SIZE(self->buf);
    if (start + total > self->limit && self->count) {
        self->full = 1;
        result = 0;
        goto done;
    }
    if (grow(self, start + total) < 0)
        goto done;
    out = PyByteArray_AS_STRING(self->buf) + start;
    out = put_uvarint(out, (uint64_t)body << 1);
    *out++ = 0; /* attributes */
    out = put_uvarint(out, ts_varint);
    out = put_uvarint(out, offset_varint);
    if (key_view.obj) {
        out = put_uvarint(out, (uint64_t)key_view.len << 1);
        memcpy(out, key_view.buf, (size_t)key_view.len);
        out += key_view.len;
    }
    else {
        *out++ = 1;
    }
    if (value_view.obj) {
        out = put_uvarint(out, (uint64_t)value_view.len << 1);
        memcpy(out, value_view.buf, (size_t)value_view.len);
        out += value_view.len;
    }
    else {
        *out++ = 1;
    }
    if (resolved != NULL) {
        out = put_uvarint(out, (uint64_t)header_count << 1);
        for (Py_ssize_t i = 0; i < header_count; i++) {
            out = put_uvarint(out, (uint64_t)resolved[i].name_len << 1);
            memcpy(out, resolved[i].name, (size_t)resolved[i].name_len);
            out += resolved[i].name_len;
            if (resolved[i].value.obj) {
                out = put_uvarint(out, (uint64_t)resolved[i].value.len << 1);
                memcpy(out, resolved[i].value.buf, (size_t)resolved[i].value.len);
                out += resolved[i].value.len;
            }
            else {
                *out++ = 1;
            }
        }
    }
    else {
        *out++ = 0; /* no headers */
    }
    result = 1;
done:
    if (resolved != NULL)
        release_headers(resolved, header_count);
    if (key_view.obj)
        PyBuffer_Release(&key_view);
    if (value_view.obj)
        PyBuffer_Release(&value_view);
    return result;
}

/* Account for the record encode_record just appended; returns its offset delta. */
static long long
count_record(RecordsCore *self, long long timestamp)
{
    if (self->count) {
        if (timestamp > self->max_ts)
            self->max_ts = timestamp;
    }
    else {
        self->base_ts = self->max_ts = timestamp;
    }
    self->count++;
    note_if_full(self);
    return self->count - 1;
}

/* Encode one record at ``timestamp`` and account for it: 1 with its offset delta in ``*index``,
 * 0 if it does not fit (the builder is then full), -1 on error. */
static int
append_record(RecordsCore *self, long long timestamp, PyObject *key, PyObject *value, PyObject *headers,
              long long *index)
{
    int64_t delta = self->count ? (int64_t)timestamp - (int64_t)self->base_ts : 0;
    int appended = encode_record(self, zigzag(delta), key, value, headers);
    if (appended > 0)
        *index = count_record(self, timestamp);
    return appended;
}

/* The size a record of bytes-or-None ``key`` and ``value`` and no headers reserves (``overhead``
 * plus their lengths); -1 if either is anything else, which only send()'s own path takes. */
static inline Py_ssize_t
plain_record_size(PyObject *key, PyObject *value, Py_ssize_t overhead)
{
    if ((value != Py_None && !PyBytes_CheckExact(value)) || (key != Py_None && !PyBytes_CheckExact(key)))
        return -1;
    return overhead + (key == Py_None ? 0 : PyBytes_GET_SIZE(key)) + (value == Py_None ? 0 : PyBytes_GET_SIZE(value));
}

PyDoc_STRVAR(append_doc,
             "append(timestamp_ms, key, value, headers=())\n--\n\n"
             "Encode one record; return its offset delta, or None if it does not fit.");

static PyObject *
RecordsCore_append(RecordsCore *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"timestamp_ms", "key", "value", "headers"};
    PyObject *values[4] = {NULL, NULL, NULL, NULL};
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    long long timestamp, index;
    int appended;

    if (nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "append() takes at most 4 arguments");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        values[i] = args[i];
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *kw = PyTuple_GET_ITEM(kwnames, i);
        int found = 0;
        for (int j = 0; j < 4; j++) {
            if (PyUnicode_CompareWithASCIIString(kw, names[j]) == 0) {
                if (values[j] != NULL) {
                    PyErr_Format(PyExc_TypeError, "append() got multiple values for argument '%s'", names[j]);
                    return NULL;
                }
                values[j] = args[nargs + i];
                found = 1;
                break;
            }
        }
        if (!found) {
            PyErr_Format(PyExc_TypeError, "append() got an unexpected keyword argument '%U'", kw);
            return NULL;
        }
    }
    if (values[0] == NULL || values[1] == NULL || values[2] == NULL) {
        PyErr_SetString(PyExc_TypeError, "append() needs timestamp_ms, key and value");
        return NULL;
    }
    if (check_open(self) < 0 || timestamp_arg(values[0], &timestamp) < 0)
        return NULL;
    appended = append_record(self, timestamp, values[1], values[2], values[3], &index);
    if (appended < 0)
        return NULL;
    if (!appended)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(index);
}

/* ``values`` and ``keys`` (None: no keys, and *key_seq is NULL) as fast sequences, for a loop
 * over a send_many call's records: 0, or -1 with an exception set and nothing held. */
static int
fast_values_and_keys(PyObject *values, PyObject *keys, PyObject **value_seq, PyObject **key_seq)
{
    *key_seq = NULL;
    *value_seq = PySequence_Fast(values, "values must be a sequence");
    if (*value_seq == NULL)
        return -1;
    if (keys != Py_None && (*key_seq = PySequence_Fast(keys, "keys must be a sequence")) == NULL) {
        Py_CLEAR(*value_seq);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(append_values_doc,
             "append_values(timestamp_ms, values, keys, start, stop, budget, overhead)\n--\n\n"
             "Append values[start:stop] (and keys) without headers, in one loop; (appended, cost).");

static PyObject *
RecordsCore_append_values(RecordsCore *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *values, *keys, *value_seq = NULL, *key_seq = NULL, *result = NULL;
    long long timestamp;
    Py_ssize_t start, stop, budget, overhead, index, cost = 0, first;
    uint64_t ts_varint;

    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "append_values() takes 7 arguments");
        return NULL;
    }
    if (check_open(self) < 0 || timestamp_arg(args[0], &timestamp) < 0)
        return NULL;
    values = args[1];
    keys = args[2];
    /* One at a time: a conversion may run Python code (__index__), never with an error set. */
    if ((start = PyNumber_AsSsize_t(args[3], PyExc_OverflowError)) == -1 && PyErr_Occurred())
        return NULL;
    if ((stop = PyNumber_AsSsize_t(args[4], PyExc_OverflowError)) == -1 && PyErr_Occurred())
        return NULL;
    if ((budget = PyNumber_AsSsize_t(args[5], PyExc_OverflowError)) == -1 && PyErr_Occurred())
        return NULL;
    if ((overhead = PyNumber_AsSsize_t(args[6], PyExc_OverflowError)) == -1 && PyErr_Occurred())
        return NULL;
    if (self->section != NULL && self->section != Py_None)
        return Py_BuildValue("(nn)", (Py_ssize_t)0, (Py_ssize_t)0);
    if (fast_values_and_keys(values, keys, &value_seq, &key_seq) < 0)
        return NULL;
    if (stop > PySequence_Fast_GET_SIZE(value_seq) ||
        (key_seq != NULL && stop > PySequence_Fast_GET_SIZE(key_seq)) || start < 0) {
        PyErr_SetString(PyExc_IndexError, "append_values range out of bounds");
        goto done;
    }
    first = (Py_ssize_t)self->count;
    ts_varint = zigzag(first ? (int64_t)timestamp - (int64_t)self->base_ts : 0);
    for (index = start; index < stop; index++) {
        PyObject *value = PySequence_Fast_GET_ITEM(value_seq, index);
        PyObject *key = key_seq ? PySequence_Fast_GET_ITEM(key_seq, index) : Py_None;
        Py_ssize_t size = plain_record_size(key, value, overhead);
        int appended;
        if (size < 0)
            break;
        if (cost + size > budget)
            break;
        appended = encode_record(self, ts_varint, key, value, NULL);
        if (appended < 0)
            goto done;
        if (!appended)
            break;
        self->count++;
        cost += size;
    }
    if ((Py_ssize_t)self->count > first) {
        note_if_full(self);
        if (!first)
            self->base_ts = self->max_ts = timestamp;
        else if (timestamp > self->max_ts)
            self->max_ts = timestamp;
    }
    result = Py_BuildValue("(nn)", index - start, cost);
done:
    Py_XDECREF(value_seq);
    Py_XDECREF(key_seq);
    return result;
}

static void
RecordsCore_dealloc(RecordsCore *self)
{
    Py_XDECREF(self->buf);
    Py_XDECREF(self->section);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject RecordsCoreType;

static PyObject *
RecordsCore_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    RecordsCore *self = (RecordsCore *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    /* A subclass defined in Python (RecordBatchBuilder) is a collected type, so each builder
     * would be tracked and, living as long as its batch is unanswered, outlive the young
     * collections: over 1,000 partitions, one more object per batch counted towards the next
     * full collection, which walks every object the application keeps. A builder refers only
     * to bytes, integers, its codec and its class, none of which refers to a builder, so it
     * can never be part of a reference cycle: the collector need not see it (as CPython does
     * for tuples of atomic values). Only that class (a direct subclass without a __dict__): an
     * application's subclass of it may keep anything, the builder itself included. */
    if (type->tp_base == &RecordsCoreType && type->tp_dictoffset == 0 && PyObject_GC_IsTracked((PyObject *)self))
        PyObject_GC_UnTrack(self);
    self->buf = PyByteArray_FromStringAndSize(NULL, 0);
    if (self->buf == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    Py_INCREF(Py_None);
    self->section = Py_None;
    self->limit = -1;
    return (PyObject *)self;
}

static PyMethodDef RecordsCore_methods[] = {
    {"append", (PyCFunction)(void (*)(void))RecordsCore_append, METH_FASTCALL | METH_KEYWORDS, append_doc},
    {"append_values", (PyCFunction)(void (*)(void))RecordsCore_append_values, METH_FASTCALL, append_values_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef RecordsCore_members[] = {
    {"_buf", T_OBJECT_EX, offsetof(RecordsCore, buf), 0, NULL},
    {"_section", T_OBJECT, offsetof(RecordsCore, section), 0, NULL},
    {"_count", T_LONGLONG, offsetof(RecordsCore, count), 0, NULL},
    {"_base_ts", T_LONGLONG, offsetof(RecordsCore, base_ts), 0, NULL},
    {"_max_ts", T_LONGLONG, offsetof(RecordsCore, max_ts), 0, NULL},
    {"_limit", T_LONGLONG, offsetof(RecordsCore, limit), 0, NULL},
    {"_full", T_BOOL, offsetof(RecordsCore, full), 0, NULL},
    {"is_full", T_BOOL, offsetof(RecordsCore, full), READONLY,
     "True once a record was refused, the builder was built, or not even an empty record fits."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject RecordsCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aioprod._speedups.RecordsCore",
    .tp_basicsize = sizeof(RecordsCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The record encoder of a record batch builder (compiled).",
    .tp_new = RecordsCore_new,
    .tp_dealloc = (destructor)RecordsCore_dealloc,
    .tp_methods = RecordsCore_methods,
    .tp_members = RecordsCore_members,
};


/* -- RecordFuture ----------------------------------------------------------------------------- */
/* The future Producer.send returns (aioprod/producer/record_future.py has the Python twin and
 * the documentation). Applications keep many of them (one per record in flight), so the
 * garbage collector tracks one only once it may be part of a reference cycle, as CPython does
 * for tuples and dicts: when it gets a done-callback (which may hold the future) or a
 * cancellation message. Until then it refers only to its batch's settlement, whose outcome
 * holds no caller's objects: a failed batch hands each caller its own copy of the error (see
 * _metadata_of and _error_of), so a traceback through a caller's frame never hangs off the
 * batch. The common outcome, an acknowledgement of a batch that was not split, is read here;
 * the rare paths (split batches, failures, callbacks, repr) call the Python helpers
 * record_future.py registers with setup_record_future(). */

static PyObject *metadata_of;      /* (outcome, index, timestamp) -> RecordMetadata, or raises */
static PyTypeObject *metadata_cls; /* RecordMetadata */
static PyObject *error_of;         /* (outcome, index) -> exception or None */
static PyObject *call_back;        /* (future, callbacks) -> None */
static PyObject *describe;         /* (future) -> str */
static PyObject *cancelled_error;  /* asyncio.CancelledError */
static PyObject *invalid_state;    /* asyncio.InvalidStateError */
static PyObject *str_outcome, *str_loop, *str_call_soon, *str_context, *str_watch, *str_unwatch;

typedef struct {
    PyObject_HEAD
    PyObject *settlement;     /* BatchSettlement: its outcome is None until the batch has one */
    PyObject *callbacks;      /* list of (fn, context), or NULL */
    PyObject *cancel_message; /* NULL while not cancelled; then None or the message */
    PyObject *weakreflist;
    Py_ssize_t index;         /* the record's offset delta in its batch */
    long long timestamp;
    char blocking;            /* asyncio's _asyncio_future_blocking */
} RecordFutureObject;

static PyTypeObject RecordFutureType;
static PyObject *new_metadata(PyTypeObject *cls, PyObject *topic, PyObject *partition, PyObject *offset,
                              PyObject *timestamp);

/* A batch acknowledged whole: its outcome is an exact (topic, partition, base offset, log-append
 * time or -1) tuple. A failure (BatchFailure, a tuple subclass) and a split (SplitOutcome) are
 * not. */
static inline int
is_acknowledgement(PyObject *outcome)
{
    return PyTuple_CheckExact(outcome) && PyTuple_GET_SIZE(outcome) == 4;
}

/* The record's RecordMetadata from its batch's acknowledgement, as _metadata_of gives it. */
static PyObject *
acknowledged_metadata(RecordFutureObject *self, PyObject *ack)
{
    PyObject *offset, *timestamp, *result;
    long long base = PyLong_AsLongLong(PyTuple_GET_ITEM(ack, 2));
    long long log_append_time = PyLong_AsLongLong(PyTuple_GET_ITEM(ack, 3));
    if ((base == -1 || log_append_time == -1) && PyErr_Occurred())
        return NULL;
    offset = PyLong_FromLongLong(base >= 0 ? base + self->index : -1);
    if (offset == NULL)
        return NULL;
    timestamp = log_append_time >= 0 ? Py_NewRef(PyTuple_GET_ITEM(ack, 3)) : PyLong_FromLongLong(self->timestamp);
    if (timestamp == NULL) {
        Py_DECREF(offset);
        return NULL;
    }
    result = new_metadata(metadata_cls, PyTuple_GET_ITEM(ack, 0), PyTuple_GET_ITEM(ack, 1), offset, timestamp);
    Py_DECREF(timestamp);
    return result;
}

static int
ready(void)
{
    if (metadata_of == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "aioprod._speedups.setup_record_future() was not called");
        return -1;
    }
    return 0;
}

/* 1 if the batch has its outcome, 0 if not, -1 on error. */
static int
batch_done(RecordFutureObject *self)
{
    PyObject *outcome = PyObject_GetAttr(self->settlement, str_outcome);
    if (outcome == NULL)
        return -1;
    Py_DECREF(outcome);
    return outcome != Py_None;
}

static int
future_done(RecordFutureObject *self)
{
    return self->cancel_message != NULL ? 1 : batch_done(self);
}

static PyObject *
make_cancelled_error(RecordFutureObject *self)
{
    if (self->cancel_message == NULL || self->cancel_message == Py_None)
        return PyObject_CallNoArgs(cancelled_error);
    return PyObject_CallOneArg(cancelled_error, self->cancel_message);
}

/* The batch's outcome, or NULL with CancelledError / InvalidStateError set. */
static PyObject *
outcome(RecordFutureObject *self)
{
    PyObject *result;
    if (self->cancel_message != NULL) {
        PyObject *error = make_cancelled_error(self);
        if (error != NULL) {
            PyErr_SetObject(cancelled_error, error);
            Py_DECREF(error);
        }
        return NULL;
    }
    result = PyObject_GetAttr(self->settlement, str_outcome);
    if (result == Py_None) {
        Py_DECREF(result);
        PyErr_SetString(invalid_state, "the record is not acknowledged or failed yet");
        return NULL;
    }
    return result;
}

static PyObject *
new_record_future(PyTypeObject *type, PyObject *settlement, Py_ssize_t index, long long timestamp)
{
    RecordFutureObject *self = PyObject_GC_New(RecordFutureObject, type);
    if (self == NULL)
        return NULL;
    self->settlement = Py_NewRef(settlement);
    self->callbacks = NULL;
    self->cancel_message = NULL;
    self->weakreflist = NULL;
    self->index = index;
    self->timestamp = timestamp;
    self->blocking = 0;
    return (PyObject *)self; /* untracked: see the top of this section */
}

static PyObject *
RecordFuture_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t index;
    long long timestamp;
    if (nargs != 3 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "RecordFuture(settlement, index, timestamp) takes 3 positional arguments");
        return NULL;
    }
    index = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
    if (index == -1 && PyErr_Occurred())
        return NULL;
    timestamp = PyLong_AsLongLong(args[2]);
    if (timestamp == -1 && PyErr_Occurred())
        return NULL;
    return new_record_future((PyTypeObject *)type, args[0], index, timestamp);
}

/* From now on the future may hold objects that refer back to it. */
static void
track(RecordFutureObject *self)
{
    if (!PyObject_GC_IsTracked((PyObject *)self))
        PyObject_GC_Track(self);
}

static PyObject *
RecordFuture_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "RecordFuture takes no keyword arguments");
        return NULL;
    }
    return RecordFuture_vectorcall((PyObject *)type, &PyTuple_GET_ITEM(args, 0), PyTuple_GET_SIZE(args), NULL);
}

static int
RecordFuture_traverse(RecordFutureObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->settlement);
    Py_VISIT(self->callbacks);
    Py_VISIT(self->cancel_message);
    return 0;
}

/* Breaks a cycle through the callbacks or the cancellation message (any object: a tuple holding
 * the future has no tp_clear to break it); the future stays cancelled, and the batch references
 * stay, so it still answers (the other objects of a cycle through the batch's error, a frame or
 * the error, clear theirs). */
static int
RecordFuture_clear(RecordFutureObject *self)
{
    Py_CLEAR(self->callbacks);
    if (self->cancel_message != NULL && self->cancel_message != Py_None)
        Py_SETREF(self->cancel_message, Py_NewRef(Py_None));
    return 0;
}

static void
RecordFuture_dealloc(RecordFutureObject *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    Py_XDECREF(self->settlement);
    Py_XDECREF(self->callbacks);
    Py_XDECREF(self->cancel_message);
    PyObject_GC_Del(self);
}

static PyObject *
RecordFuture_done(RecordFutureObject *self, PyObject *unused)
{
    int done = future_done(self);
    if (done < 0)
        return NULL;
    return PyBool_FromLong(done);
}

static PyObject *
RecordFuture_cancelled(RecordFutureObject *self, PyObject *unused)
{
    return PyBool_FromLong(self->cancel_message != NULL);
}

static PyObject *
RecordFuture_get_loop(RecordFutureObject *self, PyObject *unused)
{
    return PyObject_GetAttr(self->settlement, str_loop);
}

static PyObject *
RecordFuture_make_cancelled_error(RecordFutureObject *self, PyObject *unused)
{
    return make_cancelled_error(self);
}

static PyObject *
RecordFuture_result(RecordFutureObject *self, PyObject *unused)
{
    PyObject *got, *stamp, *result;
    if (ready() < 0 || (got = outcome(self)) == NULL)
        return NULL;
    if (is_acknowledgement(got)) {
        result = acknowledged_metadata(self, got);
        Py_DECREF(got);
        return result;
    }
    stamp = PyLong_FromLongLong(self->timestamp);
    if (stamp == NULL) {
        Py_DECREF(got);
        return NULL;
    }
    {
        PyObject *index = PyLong_FromSsize_t(self->index);
        if (index == NULL) {
            Py_DECREF(got);
            Py_DECREF(stamp);
            return NULL;
        }
        PyObject *call_args[3] = {got, index, stamp};
        result = PyObject_Vectorcall(metadata_of, call_args, 3, NULL);
        Py_DECREF(index);
    }
    Py_DECREF(got);
    Py_DECREF(stamp);
    return result;
}

static PyObject *
RecordFuture_exception(RecordFutureObject *self, PyObject *unused)
{
    PyObject *got, *index, *result;
    if (ready() < 0 || (got = outcome(self)) == NULL)
        return NULL;
    if (is_acknowledgement(got)) {
        Py_DECREF(got);
        Py_RETURN_NONE;
    }
    index = PyLong_FromSsize_t(self->index);
    if (index == NULL) {
        Py_DECREF(got);
        return NULL;
    }
    {
        PyObject *call_args[2] = {got, index};
        result = PyObject_Vectorcall(error_of, call_args, 2, NULL);
    }
    Py_DECREF(got);
    Py_DECREF(index);
    return result;
}

/* loop.call_soon(fn, self, context=context) */
static int
call_soon(RecordFutureObject *self, PyObject *fn, PyObject *context)
{
    PyObject *loop = PyObject_GetAttr(self->settlement, str_loop), *method, *handle, *names;
    if (loop == NULL)
        return -1;
    method = PyObject_GetAttr(loop, str_call_soon);
    Py_DECREF(loop);
    if (method == NULL)
        return -1;
    names = PyTuple_Pack(1, str_context);
    if (names == NULL) {
        Py_DECREF(method);
        return -1;
    }
    {
        PyObject *call_args[3] = {fn, (PyObject *)self, context};
        handle = PyObject_Vectorcall(method, call_args, 2, names);
    }
    Py_DECREF(names);
    Py_DECREF(method);
    if (handle == NULL)
        return -1;
    Py_DECREF(handle);
    return 0;
}

static PyObject *
RecordFuture_add_done_callback(RecordFutureObject *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames)
{
    PyObject *fn, *context = NULL, *entry;
    int done;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "add_done_callback() takes one positional argument");
        return NULL;
    }
    fn = args[0];
    for (Py_ssize_t i = 0; i < nkw; i++) {
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, i), "context") != 0) {
            PyErr_Format(PyExc_TypeError, "add_done_callback() got an unexpected keyword argument '%U'",
                         PyTuple_GET_ITEM(kwnames, i));
            return NULL;
        }
        context = args[nargs + i];
    }
    if (context == NULL || context == Py_None)
        context = PyContext_CopyCurrent();
    else
        Py_INCREF(context);
    if (context == NULL)
        return NULL;
    done = future_done(self);
    if (done < 0)
        goto fail;
    if (done || self->cancel_message != NULL) { /* reading the outcome may have cancelled it */
        if (call_soon(self, fn, context) < 0)
            goto fail;
        Py_DECREF(context);
        Py_RETURN_NONE;
    }
    entry = PyTuple_Pack(2, fn, context);
    Py_DECREF(context);
    if (entry == NULL)
        return NULL;
    track(self);
    if (self->callbacks == NULL) {
        PyObject *watched;
        self->callbacks = PyList_New(1);
        if (self->callbacks == NULL) {
            Py_DECREF(entry);
            return NULL;
        }
        PyList_SET_ITEM(self->callbacks, 0, entry);
        watched = PyObject_CallMethodOneArg(self->settlement, str_watch, (PyObject *)self);
        if (watched == NULL) {
            Py_CLEAR(self->callbacks);
            return NULL;
        }
        Py_DECREF(watched);
    }
    else {
        int appended = PyList_Append(self->callbacks, entry);
        Py_DECREF(entry);
        if (appended < 0)
            return NULL;
    }
    Py_RETURN_NONE;
fail:
    Py_DECREF(context);
    return NULL;
}

static int
unwatch(RecordFutureObject *self)
{
    PyObject *result = PyObject_CallMethodOneArg(self->settlement, str_unwatch, (PyObject *)self);
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    return 0;
}

static PyObject *
RecordFuture_remove_done_callback(RecordFutureObject *self, PyObject *fn)
{
    PyObject *kept, *callbacks;
    Py_ssize_t removed, count;
    int done;
retry:
    if (self->callbacks == NULL || PyList_GET_SIZE(self->callbacks) == 0)
        return PyLong_FromLong(0);
    done = future_done(self);
    if (done < 0)
        return NULL;
    /* Once done, its callbacks are as good as scheduled; reading the outcome runs Python code,
     * which may have run or cancelled them. */
    if (done || self->callbacks == NULL)
        return PyLong_FromLong(0);
    kept = PyList_New(0);
    if (kept == NULL)
        return NULL;
    /* A comparison runs Python code (a callback's __eq__), which may add callbacks, cancel the
     * future or settle it: hold the list and each entry, and re-read the size every time. */
    callbacks = Py_NewRef(self->callbacks);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(callbacks); i++) {
        PyObject *entry = Py_NewRef(PyList_GET_ITEM(callbacks, i));
        int equal = PyObject_RichCompareBool(PyTuple_GET_ITEM(entry, 0), fn, Py_EQ);
        if (equal < 0 || (!equal && PyList_Append(kept, entry) < 0)) {
            Py_DECREF(entry);
            Py_DECREF(callbacks);
            Py_DECREF(kept);
            return NULL;
        }
        Py_DECREF(entry);
    }
    count = PyList_GET_SIZE(callbacks);
    if (self->callbacks != callbacks) {
        Py_DECREF(callbacks);
        Py_DECREF(kept);
        /* Cancelled or run meanwhile: they are scheduled. Replaced by a removal that a
         * comparison ran: remove from the list there is now. */
        if (self->callbacks != NULL && self->cancel_message == NULL)
            goto retry;
        return PyLong_FromLong(0);
    }
    Py_DECREF(callbacks);
    removed = count - PyList_GET_SIZE(kept);
    if (PyList_GET_SIZE(kept) == 0) {
        Py_DECREF(kept);
        Py_CLEAR(self->callbacks);
        if (unwatch(self) < 0)
            return NULL;
    }
    else if (removed) {
        Py_SETREF(self->callbacks, kept);
    }
    else {
        Py_DECREF(kept);
    }
    return PyLong_FromSsize_t(removed);
}

static PyObject *
RecordFuture_cancel(RecordFutureObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *msg = Py_None, *callbacks;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    int done;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "cancel() takes at most one argument");
        return NULL;
    }
    if (nargs == 1)
        msg = args[0];
    for (Py_ssize_t i = 0; i < nkw; i++) {
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, i), "msg") != 0) {
            PyErr_Format(PyExc_TypeError, "cancel() got an unexpected keyword argument '%U'",
                         PyTuple_GET_ITEM(kwnames, i));
            return NULL;
        }
        msg = args[nargs + i];
    }
    done = future_done(self);
    if (done < 0)
        return NULL;
    if (done || self->cancel_message != NULL) /* reading the outcome may have cancelled it */
        Py_RETURN_FALSE;
    Py_INCREF(msg);
    track(self);
    self->cancel_message = msg;
    callbacks = self->callbacks;
    self->callbacks = NULL;
    if (callbacks != NULL) {
        Py_ssize_t count = PyList_GET_SIZE(callbacks);
        if (unwatch(self) < 0) {
            Py_DECREF(callbacks);
            return NULL;
        }
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *entry = PyList_GET_ITEM(callbacks, i);
            if (call_soon(self, PyTuple_GET_ITEM(entry, 0), PyTuple_GET_ITEM(entry, 1)) < 0) {
                Py_DECREF(callbacks);
                return NULL;
            }
        }
        Py_DECREF(callbacks);
    }
    Py_RETURN_TRUE;
}

/* Another future of the same record, with callbacks and cancellation of its own. */
static PyObject *
RecordFuture_twin(RecordFutureObject *self, PyObject *unused)
{
    RecordFutureObject *twin = PyObject_GC_New(RecordFutureObject, Py_TYPE(self));
    if (twin == NULL)
        return NULL;
    twin->settlement = Py_NewRef(self->settlement);
    twin->callbacks = NULL;
    twin->cancel_message = NULL;
    twin->weakreflist = NULL;
    twin->index = self->index;
    twin->timestamp = self->timestamp;
    twin->blocking = 0;
    return (PyObject *)twin; /* untracked, as a new future */
}

static PyObject *
RecordFuture_run_callbacks(RecordFutureObject *self, PyObject *unused)
{
    PyObject *callbacks = self->callbacks, *result;
    self->callbacks = NULL;
    if (callbacks == NULL)
        Py_RETURN_NONE;
    if (ready() < 0) {
        Py_DECREF(callbacks);
        return NULL;
    }
    {
        PyObject *call_args[2] = {(PyObject *)self, callbacks};
        result = PyObject_Vectorcall(call_back, call_args, 2, NULL);
    }
    Py_DECREF(callbacks);
    return result;
}

static PyObject *
RecordFuture_repr(RecordFutureObject *self)
{
    if (ready() < 0)
        return NULL;
    return PyObject_CallOneArg(describe, (PyObject *)self);
}

/* The iterator behind ``await future``: yields the future once (a task then waits on it),
 * then returns its result. */
typedef struct {
    PyObject_HEAD
    RecordFutureObject *future;
    int yielded;
} RecordFutureIterObject;

static PyTypeObject RecordFutureIterType;

static PyObject *
RecordFuture_await(RecordFutureObject *self)
{
    RecordFutureIterObject *iter = PyObject_GC_New(RecordFutureIterObject, &RecordFutureIterType);
    if (iter == NULL)
        return NULL;
    Py_INCREF(self);
    iter->future = self;
    iter->yielded = 0;
    PyObject_GC_Track(iter);
    return (PyObject *)iter;
}

/* The same as a method: METH_NOARGS functions take a second, unused argument, and calling
   the one-argument slot function through that signature is undefined behaviour. */
static PyObject *
RecordFuture_await_method(RecordFutureObject *self, PyObject *Py_UNUSED(ignored))
{
    return RecordFuture_await(self);
}

static int
RecordFutureIter_traverse(RecordFutureIterObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->future);
    return 0;
}

static void
RecordFutureIter_dealloc(RecordFutureIterObject *self)
{
    PyObject_GC_UnTrack(self);
    Py_XDECREF(self->future);
    PyObject_GC_Del(self);
}

static PyObject *
RecordFutureIter_next(RecordFutureIterObject *self)
{
    RecordFutureObject *future = self->future;
    PyObject *result, *stop;
    int done = future_done(future);
    if (done < 0)
        return NULL;
    if (!done) {
        if (self->yielded) {
            PyErr_SetString(PyExc_RuntimeError, "await wasn't used with future");
            return NULL;
        }
        self->yielded = 1;
        future->blocking = 1;
        Py_INCREF(future);
        return (PyObject *)future;
    }
    result = RecordFuture_result(future, NULL);
    if (result == NULL)
        return NULL;
    /* StopIteration(result), made explicitly: RecordMetadata is a tuple, which PyErr_SetObject
     * would take for the exception's arguments. */
    stop = PyObject_CallOneArg(PyExc_StopIteration, result);
    Py_DECREF(result);
    if (stop == NULL)
        return NULL;
    PyErr_SetObject(PyExc_StopIteration, stop);
    Py_DECREF(stop);
    return NULL;
}

static PyObject *
RecordFutureIter_send(RecordFutureIterObject *self, PyObject *value)
{
    return RecordFutureIter_next(self);
}

static PyMethodDef RecordFutureIter_methods[] = {
    {"send", (PyCFunction)RecordFutureIter_send, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RecordFutureIterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aioprod._speedups.RecordFutureIter",
    .tp_basicsize = sizeof(RecordFutureIterObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)RecordFutureIter_dealloc,
    .tp_traverse = (traverseproc)RecordFutureIter_traverse,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)RecordFutureIter_next,
    .tp_methods = RecordFutureIter_methods,
};

static PyObject *
RecordFuture_get_blocking(RecordFutureObject *self, void *closure)
{
    return PyBool_FromLong(self->blocking);
}

static int
RecordFuture_set_blocking(RecordFutureObject *self, PyObject *value, void *closure)
{
    int truth;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete _asyncio_future_blocking");
        return -1;
    }
    truth = PyObject_IsTrue(value);
    if (truth < 0)
        return -1;
    self->blocking = (char)truth;
    return 0;
}

static PyObject *
RecordFuture_get_timestamp(RecordFutureObject *self, void *closure)
{
    return PyLong_FromLongLong(self->timestamp);
}

/* Read by asyncio.gather(return_exceptions=True) for a cancelled child. */
static PyObject *
RecordFuture_get_cancel_message(RecordFutureObject *self, void *closure)
{
    return Py_NewRef(self->cancel_message != NULL ? self->cancel_message : Py_None);
}

static PyGetSetDef RecordFuture_getset[] = {
    {"_cancel_message", (getter)RecordFuture_get_cancel_message, NULL, NULL, NULL},
    {"_asyncio_future_blocking", (getter)RecordFuture_get_blocking, (setter)RecordFuture_set_blocking, NULL, NULL},
    {"_timestamp", (getter)RecordFuture_get_timestamp, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef RecordFuture_members[] = {
    {"_settlement", T_OBJECT, offsetof(RecordFutureObject, settlement), READONLY, NULL},
    {"_index", T_PYSSIZET, offsetof(RecordFutureObject, index), READONLY, NULL},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(RecordFutureObject, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef RecordFuture_methods[] = {
    {"done", (PyCFunction)RecordFuture_done, METH_NOARGS, NULL},
    {"cancelled", (PyCFunction)RecordFuture_cancelled, METH_NOARGS, NULL},
    {"get_loop", (PyCFunction)RecordFuture_get_loop, METH_NOARGS, NULL},
    {"_make_cancelled_error", (PyCFunction)RecordFuture_make_cancelled_error, METH_NOARGS, NULL},
    {"result", (PyCFunction)RecordFuture_result, METH_NOARGS, NULL},
    {"exception", (PyCFunction)RecordFuture_exception, METH_NOARGS, NULL},
    {"add_done_callback", (PyCFunction)(void (*)(void))RecordFuture_add_done_callback,
     METH_FASTCALL | METH_KEYWORDS, NULL},
    {"remove_done_callback", (PyCFunction)RecordFuture_remove_done_callback, METH_O, NULL},
    {"cancel", (PyCFunction)(void (*)(void))RecordFuture_cancel, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"_run_callbacks", (PyCFunction)RecordFuture_run_callbacks, METH_NOARGS, NULL},
    {"twin", (PyCFunction)RecordFuture_twin, METH_NOARGS,
     "Another future of the same record, with callbacks and cancellation of its own."},
    {"__await__", (PyCFunction)RecordFuture_await_method, METH_NOARGS, NULL},
    {"__iter__", (PyCFunction)RecordFuture_await_method, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyAsyncMethods RecordFuture_async = {
    .am_await = (unaryfunc)RecordFuture_await,
};

static PyTypeObject RecordFutureType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aioprod.RecordFuture",
    .tp_basicsize = sizeof(RecordFutureObject),
    /* No Py_TPFLAGS_HAVE_VECTORCALL: that flag is about calling an instance (through
     * tp_vectorcall_offset, 0 here), and made ``future()`` jump through the refcount; calling
     * the type uses .tp_vectorcall without it. */
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One record's delivery: an asyncio-compatible future (compiled; see "
              "aioprod.producer.record_future).",
    .tp_new = RecordFuture_new,
    .tp_vectorcall = RecordFuture_vectorcall,
    .tp_dealloc = (destructor)RecordFuture_dealloc,
    .tp_traverse = (traverseproc)RecordFuture_traverse,
    .tp_clear = (inquiry)RecordFuture_clear,
    .tp_repr = (reprfunc)RecordFuture_repr,
    .tp_as_async = &RecordFuture_async,
    .tp_iter = (getiterfunc)RecordFuture_await,
    .tp_weaklistoffset = offsetof(RecordFutureObject, weakreflist),
    .tp_methods = RecordFuture_methods,
    .tp_members = RecordFuture_members,
    .tp_getset = RecordFuture_getset,
};

static PyObject *
speedups_setup_record_future(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "setup_record_future() takes 7 arguments");
        return NULL;
    }
    if (!PyType_Check(args[6]) || !PyType_IsSubtype((PyTypeObject *)args[6], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "setup_record_future() needs RecordMetadata, a tuple subclass, last");
        return NULL;
    }
    Py_XSETREF(metadata_of, Py_NewRef(args[0]));
    Py_XSETREF(error_of, Py_NewRef(args[1]));
    Py_XSETREF(call_back, Py_NewRef(args[2]));
    Py_XSETREF(describe, Py_NewRef(args[3]));
    Py_XSETREF(cancelled_error, Py_NewRef(args[4]));
    Py_XSETREF(invalid_state, Py_NewRef(args[5]));
    Py_XSETREF(metadata_cls, (PyTypeObject *)Py_NewRef(args[6]));
    Py_RETURN_NONE;
}

/* -- metadata_range ---------------------------------------------------------------------------- */

/* cls(topic, partition, offset, timestamp) for a tuple subclass. When its fields are an exact
 * str and exact ints (always, unless a topic is a str subclass such as a StrEnum member), it can
 * never be part of a cycle and is untracked by the garbage collector, which then need not walk
 * the one per record that an application keeps. (CPython untracks such exact tuples itself,
 * lazily, but never a subclass.) Steals the reference to offset. */
static PyObject *
new_metadata(PyTypeObject *cls, PyObject *topic, PyObject *partition, PyObject *offset, PyObject *timestamp)
{
    PyObject *item = cls->tp_alloc(cls, 4);
    if (item == NULL) {
        Py_DECREF(offset);
        return NULL;
    }
    PyTuple_SET_ITEM(item, 0, Py_NewRef(topic));
    PyTuple_SET_ITEM(item, 1, Py_NewRef(partition));
    PyTuple_SET_ITEM(item, 2, offset);
    PyTuple_SET_ITEM(item, 3, Py_NewRef(timestamp));
    if (PyUnicode_CheckExact(topic) && PyLong_CheckExact(partition) && PyLong_CheckExact(offset) &&
        PyLong_CheckExact(timestamp))
        PyObject_GC_UnTrack(item);
    return item;
}

static int
check_metadata_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t expected, const char *name)
{
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments", name, expected);
        return -1;
    }
    if (!PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], &PyTuple_Type)) {
        PyErr_Format(PyExc_TypeError, "%s() needs a tuple subclass", name);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(metadata_doc,
             "metadata(cls, topic, partition, offset, timestamp)\n--\n\n"
             "cls(topic, partition, offset, timestamp), untracked by the garbage collector: one\n"
             "record's acknowledgement.");

static PyObject *
speedups_metadata(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_metadata_args(args, nargs, 5, "metadata") < 0)
        return NULL;
    return new_metadata((PyTypeObject *)args[0], args[1], args[2], Py_NewRef(args[3]), args[4]);
}

PyDoc_STRVAR(metadata_range_doc,
             "metadata_range(cls, topic, partition, first_offset, count, timestamp)\n--\n\n"
             "[cls(topic, partition, offset, timestamp), ...] for count consecutive offsets from first_offset\n"
             "(all -1 when first_offset is negative), untracked by the garbage collector: a send_many\n"
             "group's acknowledgements.");

static PyObject *
speedups_metadata_range(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyTypeObject *cls;
    PyObject *topic, *partition, *timestamp, *list, *minus_one = NULL;
    long long first;
    Py_ssize_t count;
    if (check_metadata_args(args, nargs, 6, "metadata_range") < 0)
        return NULL;
    cls = (PyTypeObject *)args[0];
    topic = args[1];
    partition = args[2];
    timestamp = args[5];
    if ((first = PyLong_AsLongLong(args[3])) == -1 && PyErr_Occurred())
        return NULL;
    if ((count = PyNumber_AsSsize_t(args[4], PyExc_OverflowError)) == -1 && PyErr_Occurred())
        return NULL;
    if (count < 0)
        count = 0;
    if (count > 0 && first > LLONG_MAX - (count - 1)) {
        PyErr_SetString(PyExc_OverflowError, "metadata_range: the last offset is out of int64 range");
        return NULL;
    }
    list = PyList_New(count);
    if (list == NULL)
        return NULL;
    if (first < 0 && (minus_one = PyLong_FromLong(-1)) == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *offset = first < 0 ? Py_NewRef(minus_one) : PyLong_FromLongLong(first + i), *item;
        if (offset == NULL)
            goto fail;
        item = new_metadata(cls, topic, partition, offset, timestamp);
        if (item == NULL)
            goto fail;
        PyList_SET_ITEM(list, i, item);
    }
    Py_XDECREF(minus_one);
    return list;
fail:
    Py_XDECREF(minus_one);
    Py_DECREF(list);
    return NULL;
}

PyDoc_STRVAR(plain_payloads_doc,
             "plain_payloads(values, keys, room)\n--\n\n"
             "True if every value, and every key unless keys is None, is bytes or None, and no record's\n"
             "key and value together are longer than room: a send_many call with nothing to convert,\n"
             "serialize or refuse (aioprod/producer/producer.py has the Python twin).");

static PyObject *
speedups_plain_payloads(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *value_seq, *key_seq;
    Py_ssize_t room, count;
    int plain = 1;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "plain_payloads() takes 3 arguments");
        return NULL;
    }
    room = PyNumber_AsSsize_t(args[2], PyExc_OverflowError);
    if (room == -1 && PyErr_Occurred())
        return NULL;
    if (fast_values_and_keys(args[0], args[1], &value_seq, &key_seq) < 0)
        return NULL;
    count = PySequence_Fast_GET_SIZE(value_seq);
    if (key_seq != NULL && PySequence_Fast_GET_SIZE(key_seq) != count)
        plain = 0;
    for (Py_ssize_t i = 0; plain && i < count; i++) {
        PyObject *key = key_seq != NULL ? PySequence_Fast_GET_ITEM(key_seq, i) : Py_None;
        Py_ssize_t size = plain_record_size(key, PySequence_Fast_GET_ITEM(value_seq, i), 0);
        plain = size >= 0 && size <= room;
    }
    Py_DECREF(value_seq);
    Py_XDECREF(key_seq);
    return PyBool_FromLong(plain);
}

/* -- murmur2 ---------------------------------------------------------------------------------- */

static int32_t
murmur2_hash(const unsigned char *data, Py_ssize_t length)
{
    const uint32_t m = 0x5BD1E995;
    uint32_t h = 0x9747B28Cu ^ (uint32_t)length;
    Py_ssize_t words = length / 4, i;
    for (i = 0; i < words; i++) {
        uint32_t k;
        memcpy(&k, data + 4 * i, 4); /* little-endian, as Kafka reads it */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        k = __builtin_bswap32(k);
#endif
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    const unsigned char *tail = data + 4 * words;
    switch (length & 3) {
    case 3:
        h ^= (uint32_t)tail[2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)tail[1] << 8;
        /* fall through */
    case 1:
        h ^= tail[0];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return (int32_t)h;
}

/* toPositive(murmur2(key)) % partitions (partitions > 0): the Java client's keyed partition. */
static inline Py_ssize_t
key_partition(const unsigned char *key, Py_ssize_t length, Py_ssize_t partitions)
{
    return (Py_ssize_t)(((uint32_t)murmur2_hash(key, length) & 0x7FFFFFFFu) % (uint64_t)partitions);
}

static PyObject *
speedups_murmur2(PyObject *module, PyObject *arg)
{
    Py_buffer view;
    int32_t hash;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    hash = murmur2_hash(view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromLong(hash);
}

static PyObject *
speedups_partition_for_key(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    Py_ssize_t partitions, partition;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "partition_for_key() takes 2 arguments");
        return NULL;
    }
    partitions = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
    if (partitions == -1 && PyErr_Occurred())
        return NULL;
    if (partitions <= 0) {
        PyErr_SetString(PyExc_ZeroDivisionError, "integer division or modulo by zero");
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    partition = key_partition(view.buf, view.len, partitions);
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(partition);
}

/* Wall-clock milliseconds since the epoch: a record's CreateTime, read once per send(). In
 * Python, time.time_ns() // 1_000_000 costs about 130 ns, most of it dividing a two-digit int. */
static int
wall_ms(long long *out)
{
    struct timespec now;
    if (timespec_get(&now, TIME_UTC) != TIME_UTC) {
        PyErr_SetString(PyExc_OSError, "timespec_get() failed to read the clock");
        return -1;
    }
    *out = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    return 0;
}

static PyObject *
speedups_now_ms(PyObject *module, PyObject *unused)
{
    long long now;
    if (wall_ms(&now) < 0)
        return NULL;
    return PyLong_FromLongLong(now);
}

#if PY_VERSION_HEX < 0x030C0000
/* Python 3.11 keeps a thread's running loop in a holder in the thread's state dict, and makes a
 * new holder each time a loop starts or stops running in the thread: the holder's identity names
 * one run of one loop in one thread (Producer.send()'s loop check, _RunOf). asyncio's own
 * _get_running_loop() also calls getpid(), a system call, each time. */
static PyObject *str_running_loop_key;

static PyObject *
speedups_running_loop_holder(PyObject *module, PyObject *unused)
{
    PyObject *state = PyThreadState_GetDict();
    PyObject *holder = state == NULL ? NULL : PyDict_GetItemWithError(state, str_running_loop_key);
    if (holder == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    Py_INCREF(holder);
    return holder;
}
#endif

/* -- SendLane --------------------------------------------------------------------------------- */

/* The producer's count of sends since it last looked at the clock (Producer._clock_check): one
 * for send()'s own path and every lane, so that a loop over many topics looks as often as a loop
 * over one. */
typedef struct {
    PyObject_HEAD
    long long count;
} SendCount;

static PyMemberDef SendCount_members[] = {
    {"count", T_LONGLONG, offsetof(SendCount, count), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *
SendCount_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) || (kwargs != NULL && PyDict_GET_SIZE(kwargs))) {
        PyErr_SetString(PyExc_TypeError, "SendCount() takes no arguments");
        return NULL;
    }
    return type->tp_alloc(type, 0);
}

static PyTypeObject SendCountType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aioprod._speedups.SendCount",
    .tp_basicsize = sizeof(SendCount),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Sends since the producer last looked at the clock; shared by its lanes and send()'s own path.",
    .tp_new = SendCount_new,
    .tp_members = SendCount_members,
};

/* Producer.send()'s common case in one call, for one topic: a record whose key and value are
 * bytes or None, with no partition, timestamp or headers given, appended to its partition's
 * open batch while the topic's metadata snapshot is the one the lane was made for. It is the
 * twin of what send() does through Partitioner.keyless, BufferPool.try_reserve and
 * RecordAccumulator.append (keep them in step): where that path would do anything more (start
 * a batch, wait for memory, switch the sticky partition, look up new metadata, raise), the lane
 * changes nothing and returns None, and send() takes its own path. */

typedef struct {
    PyObject_HEAD
    PyObject *topic;
    PyObject *producer;    /* its _clock_check() and _batch_filled() */
    SendCount *sends;      /* the producer's count, which each record the lane takes adds to */
    PyObject *metadata;    /* Metadata: the lane holds while metadata.snapshot is `snapshot` */
    PyObject *snapshot;
    PyObject *tps;         /* list: the TopicPartition of each partition id */
    PyObject *batches;     /* dict: RecordAccumulator._batches */
    PyObject *pool;        /* BufferPool */
    PyObject *sticky;      /* dict: Partitioner._sticky, or None: keyless records are declined */
    PyObject *available;   /* the topic's available partitions in `snapshot` */
    Py_ssize_t partitions; /* the key hash's modulus; 0: keyed records are declined */
    long long overhead;    /* RECORD_OVERHEAD */
    long long framing;     /* RECORD_FRAMING: what the sticky partition counts besides key and value */
    long long size_limit;  /* larger records are declined (send() raises for them) */
    long long batch_size;  /* the sticky partition switches after this many bytes */
    long long clock_every; /* _SENDS_PER_CLOCK_CHECK */
} SendLane;

static PyObject *str_snapshot, *str_available, *str_produced, *str_partition, *str_payload, *str_builder,
    *str_reserved, *str_settlement, *str_waiters, *str_used, *str_total, *str_clock_check, *str_batch_filled;

static int
SendLane_traverse(SendLane *self, visitproc visit, void *arg)
{
    Py_VISIT(self->topic);
    Py_VISIT(self->producer);
    Py_VISIT(self->sends);
    Py_VISIT(self->metadata);
    Py_VISIT(self->snapshot);
    Py_VISIT(self->tps);
    Py_VISIT(self->batches);
    Py_VISIT(self->pool);
    Py_VISIT(self->sticky);
    Py_VISIT(self->available);
    return 0;
}

static int
SendLane_clear(SendLane *self)
{
    Py_CLEAR(self->topic);
    Py_CLEAR(self->producer);
    Py_CLEAR(self->sends);
    Py_CLEAR(self->metadata);
    Py_CLEAR(self->snapshot);
    Py_CLEAR(self->tps);
    Py_CLEAR(self->batches);
    Py_CLEAR(self->pool);
    Py_CLEAR(self->sticky);
    Py_CLEAR(self->available);
    return 0;
}

static void
SendLane_dealloc(SendLane *self)
{
    PyObject_GC_UnTrack(self);
    SendLane_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
SendLane_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"topic",     "producer",   "sends",    "metadata",   "snapshot",
                            "tps",       "batches",    "pool",     "sticky",     "available",
                            "partitions", "overhead",  "framing",    "size_limit", "batch_size", "clock_every",
                            NULL};
    PyObject *topic, *producer, *sends, *metadata, *snapshot, *tps, *batches, *pool, *sticky, *available;
    Py_ssize_t partitions;
    long long overhead, framing, size_limit, batch_size, clock_every;
    SendLane *self;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$UOO!OOO!O!OOOnLLLLL:SendLane", names, &topic, &producer,
                                     &SendCountType, &sends, &metadata, &snapshot, &PyList_Type, &tps,
                                     &PyDict_Type, &batches, &pool, &sticky, &available, &partitions, &overhead,
                                     &framing, &size_limit, &batch_size, &clock_every))
        return NULL;
    if (sticky != Py_None && !PyDict_CheckExact(sticky)) {
        PyErr_SetString(PyExc_TypeError, "SendLane: sticky must be a dict or None");
        return NULL;
    }
    if (!PyDict_CheckExact(batches)) {
        PyErr_SetString(PyExc_TypeError, "SendLane: batches must be a dict");
        return NULL;
    }
    if (partitions < 0 || clock_every < 1) {
        PyErr_SetString(PyExc_ValueError, "SendLane: partitions must be >= 0 and clock_every >= 1");
        return NULL;
    }
    self = (SendLane *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->topic = Py_NewRef(topic);
    self->producer = Py_NewRef(producer);
    self->sends = (SendCount *)Py_NewRef(sends);
    self->metadata = Py_NewRef(metadata);
    self->snapshot = Py_NewRef(snapshot);
    self->tps = Py_NewRef(tps);
    self->batches = Py_NewRef(batches);
    self->pool = Py_NewRef(pool);
    self->sticky = Py_NewRef(sticky);
    self->available = Py_NewRef(available);
    self->partitions = partitions;
    self->overhead = overhead;
    self->framing = framing;
    self->size_limit = size_limit;
    self->batch_size = batch_size;
    self->clock_every = clock_every;
    return (PyObject *)self;
}

/* getattr(obj, name) as a C integer; 1 if it is an int that fits, 0 if not (no error set). */
static int
int_attr(PyObject *obj, PyObject *name, long long *out)
{
    PyObject *field = PyObject_GetAttr(obj, name);
    int overflow;
    if (field == NULL)
        return -1;
    if (!PyLong_CheckExact(field)) {
        Py_DECREF(field);
        return 0;
    }
    *out = PyLong_AsLongLongAndOverflow(field, &overflow);
    Py_DECREF(field);
    if (*out == -1 && PyErr_Occurred())
        return -1;
    return !overflow;
}

/* getattr(obj, name) is expected; 1 if so, 0 if not, -1 on error. */
static int
attr_is(PyObject *obj, PyObject *name, PyObject *expected)
{
    PyObject *field = PyObject_GetAttr(obj, name);
    if (field == NULL)
        return -1;
    Py_DECREF(field);
    return field == expected;
}

/* One more record taken: every clock_every sends, the producer looks at the clock
 * (Producer._clock_check, which starts the count again), as send()'s own path does. The count
 * is a C field of an object the producer shares with every lane: kept on the producer as an
 * int, it cost each record an attribute read, an int and an attribute write. */
static int
count_unyielded(SendLane *self)
{
    PyObject *result;
    if (++self->sends->count < self->clock_every)
        return 0;
    result = PyObject_CallMethodNoArgs(self->producer, str_clock_check);
    Py_XDECREF(result);
    return result == NULL ? -1 : 0;
}

PyDoc_STRVAR(lane_send_doc,
             "send(value, key)\n--\n\n"
             "Queue the record in its partition's open batch and return its RecordFuture; or change "
             "nothing and return None, for send() to take its own path.");

static PyObject *
SendLane_send(SendLane *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *value, *key, *state = NULL, *queue = NULL, *last = NULL, *builder = NULL, *settlement = NULL;
    PyObject *new_used = NULL, *new_reserved = NULL, *new_produced = NULL, *result = NULL;
    RecordsCore *core;
    long long size, produced = 0, number, used, total, reserved, timestamp;
    Py_ssize_t partition, length;
    int found;
    char was_full;

    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "send() takes 2 arguments (value, key)");
        return NULL;
    }
    value = args[0];
    key = args[1];
    size = plain_record_size(key, value, (Py_ssize_t)self->overhead);
    if (size < 0 || size > self->size_limit)
        Py_RETURN_NONE;
    found = attr_is(self->metadata, str_snapshot, self->snapshot);
    if (found <= 0)
        return found < 0 ? NULL : Py_NewRef(Py_None);

    /* The partition: Partitioner.keyless's common case, or the key's hash. */
    if (key != Py_None) {
        if (self->partitions == 0)
            Py_RETURN_NONE;
        partition = key_partition((const unsigned char *)PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key),
                                  self->partitions);
    }
    else {
        if (self->sticky == Py_None)
            Py_RETURN_NONE;
        state = PyDict_GetItemWithError(self->sticky, self->topic);
        if (state == NULL)
            return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
        Py_INCREF(state);
        found = attr_is(state, str_available, self->available);
        if (found > 0)
            found = int_attr(state, str_produced, &produced);
        if (found > 0) {
            produced += size - self->overhead + self->framing;
            found = produced < self->batch_size; /* else the sticky partition switches */
        }
        if (found > 0)
            found = int_attr(state, str_partition, &number);
        if (found <= 0)
            goto check;
        partition = (Py_ssize_t)number;
    }
    if (partition < 0 || partition >= PyList_GET_SIZE(self->tps))
        goto decline;

    /* The partition's open batch: RecordAccumulator.append's common case. */
    queue = PyDict_GetItemWithError(self->batches, PyList_GET_ITEM(self->tps, partition));
    if (queue == NULL) {
        if (PyErr_Occurred())
            goto error;
        goto decline;
    }
    Py_INCREF(queue);
    length = PyObject_Length(queue);
    if (length < 0)
        goto error;
    if (length == 0)
        goto decline;
    last = PySequence_GetItem(queue, length - 1);
    if (last == NULL)
        goto error;
    found = attr_is(last, str_payload, Py_None);
    if (found <= 0)
        goto check;
    builder = PyObject_GetAttr(last, str_builder);
    if (builder == NULL)
        goto error;
    if (!PyObject_TypeCheck(builder, &RecordsCoreType))
        goto decline;
    core = (RecordsCore *)builder;
    if (core->limit < 0 || core->buf == NULL || !PyByteArray_Check(core->buf))
        goto decline; /* closed: send()'s own path says why */

    /* Its memory: BufferPool.try_reserve, committed only once the record is in. */
    {
        PyObject *waiters = PyObject_GetAttr(self->pool, str_waiters);
        if (waiters == NULL)
            goto error;
        length = PyObject_Length(waiters);
        Py_DECREF(waiters);
        if (length < 0)
            goto error;
        if (length > 0)
            goto decline;
    }
    found = int_attr(self->pool, str_used, &used);
    if (found > 0)
        found = int_attr(self->pool, str_total, &total);
    if (found > 0)
        found = int_attr(last, str_reserved, &reserved);
    if (found <= 0)
        goto check;
    if (used + size > total)
        goto decline;
    settlement = PyObject_GetAttr(last, str_settlement);
    if (settlement == NULL)
        goto error;
    new_used = PyLong_FromLongLong(used + size);
    new_reserved = PyLong_FromLongLong(reserved + size);
    new_produced = state == NULL ? Py_NewRef(Py_None) : PyLong_FromLongLong(produced);
    if (new_used == NULL || new_reserved == NULL || new_produced == NULL || wall_ms(&timestamp) < 0)
        goto error;

    was_full = core->full;
    found = append_record(core, timestamp, key, value, NULL, &number);
    if (found == 0)
        core->full = was_full; /* it does not fit: send()'s own path finds that out again, and starts a batch */
    if (found <= 0)
        goto check;
    if (PyObject_SetAttr(self->pool, str_used, new_used) < 0 ||
        PyObject_SetAttr(last, str_reserved, new_reserved) < 0 ||
        (state != NULL && PyObject_SetAttr(state, str_produced, new_produced) < 0))
        goto error;
    result = new_record_future(&RecordFutureType, settlement, (Py_ssize_t)number, timestamp);
    if (result != NULL && !was_full && core->full) {
        /* The record filled the batch: it is sendable now (Producer._batch_filled wakes the
         * sender), not at its linger or its partition's answer. The record is queued whatever
         * the call does: an error there is reported, not raised; but a KeyboardInterrupt or
         * SystemExit (a signal handler's, run in the call) is raised, as send()'s own path
         * raises it from RecordAccumulator.filled. */
        PyObject *filled = PyObject_CallMethodOneArg(self->producer, str_batch_filled, last);
        if (filled == NULL) {
            if (PyErr_ExceptionMatches(PyExc_Exception))
                PyErr_WriteUnraisable(self->producer);
            else
                Py_CLEAR(result);
        }
        Py_XDECREF(filled);
    }
    if (result != NULL && count_unyielded(self) < 0)
        Py_CLEAR(result);
    goto done;

check:
    if (found < 0)
        goto error;
decline:
    result = Py_NewRef(Py_None);
    goto done;
error:
    result = NULL;
done:
    Py_XDECREF(state);
    Py_XDECREF(queue);
    Py_XDECREF(last);
    Py_XDECREF(builder);
    Py_XDECREF(settlement);
    Py_XDECREF(new_used);
    Py_XDECREF(new_reserved);
    Py_XDECREF(new_produced);
    return result;
}

static PyMethodDef SendLane_methods[] = {
    {"send", (PyCFunction)(void (*)(void))SendLane_send, METH_FASTCALL, lane_send_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef SendLane_members[] = {
    {"topic", T_OBJECT, offsetof(SendLane, topic), READONLY, NULL},
    {"snapshot", T_OBJECT, offsetof(SendLane, snapshot), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject SendLaneType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aioprod._speedups.SendLane",
    .tp_basicsize = sizeof(SendLane),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Producer.send()'s common case for one topic, compiled (see aioprod/_speedups.c).",
    .tp_new = SendLane_new,
    .tp_dealloc = (destructor)SendLane_dealloc,
    .tp_traverse = (traverseproc)SendLane_traverse,
    .tp_clear = (inquiry)SendLane_clear,
    .tp_methods = SendLane_methods,
    .tp_members = SendLane_members,
};

static PyMethodDef speedups_methods[] = {
    {"metadata", (PyCFunction)(void (*)(void))speedups_metadata, METH_FASTCALL, metadata_doc},
    {"metadata_range", (PyCFunction)(void (*)(void))speedups_metadata_range, METH_FASTCALL, metadata_range_doc},
    {"plain_payloads", (PyCFunction)(void (*)(void))speedups_plain_payloads, METH_FASTCALL, plain_payloads_doc},
    {"setup_record_future", (PyCFunction)(void (*)(void))speedups_setup_record_future, METH_FASTCALL,
     "Hand RecordFuture the Python helpers it calls for its rare paths."},
    {"now_ms", speedups_now_ms, METH_NOARGS, "Wall-clock milliseconds since the epoch, as time.time_ns() // 1_000_000."},
    {"murmur2", speedups_murmur2, METH_O, "Kafka's 32-bit murmur2 of the bytes, as a signed int."},
    {"partition_for_key", (PyCFunction)(void (*)(void))speedups_partition_for_key, METH_FASTCALL,
     "toPositive(murmur2(key)) % partitions, as the Java client partitions a keyed record."},
#if PY_VERSION_HEX < 0x030C0000
    {"running_loop_holder", speedups_running_loop_holder, METH_NOARGS,
     "This thread's running-loop holder (Python 3.11), or None: a new object whenever a loop starts or stops here."},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    "aioprod._speedups",
    "aioprod's compiled hot path (see aioprod/_compiled.py).",
    -1,
    speedups_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    PyObject *module;
    if (PyType_Ready(&RecordsCoreType) < 0 || PyType_Ready(&RecordFutureType) < 0 ||
        PyType_Ready(&RecordFutureIterType) < 0 || PyType_Ready(&SendCountType) < 0 ||
        PyType_Ready(&SendLaneType) < 0)
        return NULL;
    static const struct {
        PyObject **name;
        const char *text;
    } interned[] = {
        {&str_outcome, "outcome"},
        {&str_loop, "loop"},
        {&str_call_soon, "call_soon"},
        {&str_context, "context"},
        {&str_watch, "_watch"},
        {&str_unwatch, "_unwatch"},
        {&str_snapshot, "snapshot"},
        {&str_available, "available"},
        {&str_produced, "produced"},
        {&str_partition, "partition"},
        {&str_payload, "payload"},
        {&str_builder, "builder"},
        {&str_reserved, "reserved"},
        {&str_settlement, "settlement"},
        {&str_waiters, "_waiters"},
        {&str_used, "used"},
        {&str_total, "total"},
        {&str_clock_check, "_clock_check"},
        {&str_batch_filled, "_batch_filled"},
#if PY_VERSION_HEX < 0x030C0000
        {&str_running_loop_key, "__asyncio_running_event_loop__"},
#endif
    };
    for (size_t i = 0; i < sizeof(interned) / sizeof(interned[0]); i++) {
        *interned[i].name = PyUnicode_InternFromString(interned[i].text);
        if (*interned[i].name == NULL)
            return NULL;
    }
    module = PyModule_Create(&speedups_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&RecordsCoreType);
    if (PyModule_AddObject(module, "RecordsCore", (PyObject *)&RecordsCoreType) < 0) {
        Py_DECREF(&RecordsCoreType);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&RecordFutureType);
    if (PyModule_AddObject(module, "RecordFuture", (PyObject *)&RecordFutureType) < 0) {
        Py_DECREF(&RecordFutureType);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&SendCountType);
    if (PyModule_AddObject(module, "SendCount", (PyObject *)&SendCountType) < 0) {
        Py_DECREF(&SendCountType);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&SendLaneType);
    if (PyModule_AddObject(module, "SendLane", (PyObject *)&SendLaneType) < 0) {
        Py_DECREF(&SendLaneType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
