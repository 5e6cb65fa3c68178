/* Compiled steps of the columnar Avro decoder (schema/avro_binary.py).
 *
 * decode_batch() decodes a whole batch of Avro values (one per record, each at
 * [pos[i], end[i]) of a shared data buffer) into Arrow columns (handed over through the
 * Arrow C data interface, without a copy), walking a
 * schema program that avro_binary compiles once per writer schema.  It is the fast path
 * of the typed produce path: one C loop over the records, no Python per record or per
 * field, the GIL released while it runs.  It accepts exactly the canonical encoding the
 * NumPy decoder accepts; on the first record with any problem it stops and reports that
 * record, and the NumPy decoder (the reference, which names every record's problem) runs
 * instead.  Input is untrusted: every read is bounded by the record's end.
 *
 * read_varints() and read_blobs() are single steps of the NumPy decoder (one varint or
 * one length-prefixed value per record), used by it when decode_batch() does not apply.
 *
 * Every varint goes through varint_read(), every length or item count through
 * length_within(): the canonical-encoding rules live in one place.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Status codes, mirrored by avro_binary._VARINT_PROBLEMS. */
enum { OK = 0, PAST_END = 1, NON_CANONICAL = 2, TOO_LONG = 3, MALFORMED = 4, NEGATIVE_LENGTH = 5, LONG_LENGTH = 6 };

/* ------------------------------------------------------------------ shared reads */

/* The last byte `b` (the k-th) of a zig-zag varint whose bits so far are `zz`: its value
 * and length, or why it is refused (a trailing zero byte, more than 64 bits). */
static inline int
varint_last(uint8_t b, int k, uint64_t zz, int64_t *value, int *len)
{
    if (k > 0 && b == 0)
        return NON_CANONICAL;
    if (k == 9 && b > 1)
        return TOO_LONG;
    *len = k + 1;
    *value = (int64_t)(zz >> 1) ^ -(int64_t)(zz & 1);
    return OK;
}

/* One zig-zag varint at `at`, reading no byte at or past `limit`: its value and length, or
 * a problem.  Canonical only: no trailing zero byte, at most 64 bits. */
static inline int
varint_read(const uint8_t *buf, int64_t at, int64_t limit, int64_t *value, int *len)
{
    uint64_t zz = 0;
    int k;
    if (at < 0 || at >= limit)
        return PAST_END;
    if (limit - at >= 10) {
        /* All ten bytes a varint may take are there: the same reading without a bound
         * check per byte (most values are far from their record's end). */
        const uint8_t *q = buf + at;
        for (k = 0; k < 10; k++) {
            uint8_t b = q[k];
            zz |= (uint64_t)(b & 0x7F) << (7 * k);
            if (b < 0x80)
                return varint_last(b, k, zz, value, len);
        }
        return TOO_LONG;
    }
    for (k = 0; k < 10; k++) {
        uint8_t b;
        if (at + k >= limit)
            return PAST_END;
        b = buf[at + k];
        zz |= (uint64_t)(b & 0x7F) << (7 * k);
        if (b < 0x80)
            return varint_last(b, k, zz, value, len);
    }
    return TOO_LONG; /* a tenth byte with more to come */
}

/* A varint read up to `limit` (the padded buffer's end for the single steps, so that the
 * problem named is the one the NumPy reader names; the record's end for whole-batch
 * decoding), which must also end inside its record (`end`). */
static inline int
varint_within(const uint8_t *buf, int64_t at, int64_t limit, int64_t end, int64_t *value, int *len)
{
    int problem = varint_read(buf, at, limit, value, len);
    if (problem == OK && at + *len > end)
        problem = PAST_END;
    return problem;
}

/* A length or item count at *at of a record ending at `end`: not negative and not more
 * than the bytes left after it (the NumPy decoder bounds item counts the same way).
 * Moves *at past the varint. */
static inline int
length_within(const uint8_t *buf, int64_t *at, int64_t limit, int64_t end, int64_t *length)
{
    int len = 0;
    int problem = varint_within(buf, *at, limit, end, length, &len);
    if (problem != OK)
        return problem;
    if (*length < 0)
        return NEGATIVE_LENGTH;
    if (*length > end - (*at + len))
        return LONG_LENGTH;
    *at += len;
    return OK;
}

/* ------------------------------------------------------------------ buffer arguments */

typedef struct {
    Py_buffer view;
    int held;
} Arg;

static int
arg_get(Arg *arg, PyObject *obj, int writable, Py_ssize_t itemsize, const char *what)
{
    int flags = PyBUF_C_CONTIGUOUS | (itemsize > 1 || writable ? PyBUF_FORMAT : 0) | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &arg->view, flags) < 0)
        return -1;
    arg->held = 1;
    if (arg->view.itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: items of %zd bytes expected", what, itemsize);
        return -1;
    }
    return 0;
}

static void
args_release(Arg *args, int n)
{
    int i;
    for (i = 0; i < n; i++)
        if (args[i].held) {
            PyBuffer_Release(&args[i].view);
            args[i].held = 0;
        }
}

/* ------------------------------------------------------------------ single steps */

static PyObject *
read_varints(PyObject *self, PyObject *args)
{
    PyObject *o[5];
    Arg a[5];
    Py_ssize_t n, i, failed = 0;
    PyObject *result = NULL;

    memset(a, 0, sizeof a);
    if (!PyArg_ParseTuple(args, "OOOOO:read_varints", &o[0], &o[1], &o[2], &o[3], &o[4]))
        return NULL;
    if (arg_get(&a[0], o[0], 0, 1, "data") < 0 || arg_get(&a[1], o[1], 1, 8, "pos") < 0 ||
        arg_get(&a[2], o[2], 0, 8, "end") < 0 || arg_get(&a[3], o[3], 1, 8, "values") < 0 ||
        arg_get(&a[4], o[4], 1, 1, "status") < 0)
        goto done;
    n = a[1].view.len / 8;
    if (a[2].view.len / 8 != n || a[3].view.len / 8 != n || a[4].view.len != n) {
        PyErr_SetString(PyExc_ValueError, "pos, end, values and status must have one item per record");
        goto done;
    }
    {
        const uint8_t *buf = (const uint8_t *)a[0].view.buf;
        const int64_t size = (int64_t)a[0].view.len;
        int64_t *p = (int64_t *)a[1].view.buf;
        const int64_t *e = (const int64_t *)a[2].view.buf;
        int64_t *v = (int64_t *)a[3].view.buf;
        int8_t *st = (int8_t *)a[4].view.buf;
        Py_BEGIN_ALLOW_THREADS
        for (i = 0; i < n; i++) {
            int64_t value = 0;
            int len = 0;
            int problem = varint_within(buf, p[i], size, e[i], &value, &len);
            if (problem != OK) {
                value = 0;
                p[i] = e[i]; /* where a failed record parks */
            } else {
                p[i] += len;
            }
            st[i] = (int8_t)problem;
            v[i] = value;
            failed += problem != OK;
        }
        Py_END_ALLOW_THREADS
    }
    result = PyLong_FromSsize_t(failed);
done:
    args_release(a, 5);
    return result;
}

PyDoc_STRVAR(read_varints_doc,
"read_varints(data, pos, end, values, status) -> int\n\n"
"Read one zig-zag varint per record at pos[i] of data (uint8), bounded by end[i]:\n"
"values[i] gets the value and pos[i] moves past it; a record with a problem gets\n"
"status[i] (1 past its end, 2 non-canonical, 3 longer than 64 bits, 4 malformed),\n"
"value 0 and pos[i] = end[i]. pos, end, values: int64; status: int8. Returns the\n"
"number of records with a problem.");

static PyObject *
read_blobs(PyObject *self, PyObject *args)
{
    PyObject *o[5], *body = NULL;
    Arg a[5];
    Py_ssize_t n, i, failed = 0;
    int64_t *starts = NULL, total = 0;
    PyObject *result = NULL;

    memset(a, 0, sizeof a);
    if (!PyArg_ParseTuple(args, "OOOOO:read_blobs", &o[0], &o[1], &o[2], &o[3], &o[4]))
        return NULL;
    if (arg_get(&a[0], o[0], 0, 1, "data") < 0 || arg_get(&a[1], o[1], 1, 8, "pos") < 0 ||
        arg_get(&a[2], o[2], 0, 8, "end") < 0 || arg_get(&a[3], o[3], 1, 4, "offsets") < 0 ||
        arg_get(&a[4], o[4], 1, 1, "status") < 0)
        goto done;
    n = a[1].view.len / 8;
    if (a[2].view.len / 8 != n || a[3].view.len / 4 != n + 1 || a[4].view.len != n) {
        PyErr_SetString(PyExc_ValueError, "pos, end, status need one item per record and offsets one more");
        goto done;
    }
    starts = PyMem_Malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    if (starts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    {
        const uint8_t *buf = (const uint8_t *)a[0].view.buf;
        const int64_t size = (int64_t)a[0].view.len;
        int64_t *p = (int64_t *)a[1].view.buf;
        const int64_t *e = (const int64_t *)a[2].view.buf;
        int32_t *off = (int32_t *)a[3].view.buf;
        int8_t *st = (int8_t *)a[4].view.buf;
        char *out;
        off[0] = 0;
        for (i = 0; i < n; i++) {
            int64_t length = 0, at = p[i];
            int problem = length_within(buf, &at, size, e[i], &length);
            if (problem != OK) {
                length = 0;
                at = e[i];
                failed++;
            }
            st[i] = (int8_t)problem;
            starts[i] = at;
            p[i] = at + length;
            total += length;
            if (total > INT32_MAX) {
                PyErr_SetString(PyExc_OverflowError, "batch values exceed 2 GiB");
                goto done;
            }
            off[i + 1] = (int32_t)total;
        }
        body = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
        if (body == NULL)
            goto done;
        out = PyBytes_AS_STRING(body);
        Py_BEGIN_ALLOW_THREADS
        for (i = 0; i < n; i++)
            memcpy(out + off[i], buf + starts[i], (size_t)(off[i + 1] - off[i]));
        Py_END_ALLOW_THREADS
    }
    result = Py_BuildValue("nN", failed, body);
    body = NULL;
done:
    Py_XDECREF(body);
    PyMem_Free(starts);
    args_release(a, 5);
    return result;
}

PyDoc_STRVAR(read_blobs_doc,
"read_blobs(data, pos, end, offsets, status) -> (int, bytes)\n\n"
"Read one length-prefixed byte string per record (Avro bytes/string): offsets (int32,\n"
"one more than records) and the returned body hold them as an Arrow binary column;\n"
"pos[i] moves past each. A record with a problem (status 1-4 as read_varints for the\n"
"length, 5 negative length, 6 length past the record's end) gets an empty value and\n"
"pos[i] = end[i]. Returns the number of records with a problem and the body.");

/* ------------------------------------------------------------------ whole-batch decoding */

/* Operations of a schema program, mirrored by avro_binary._Op. */
enum {
    OP_NULL = 0, OP_BOOLEAN = 1, OP_INT = 2, OP_LONG = 3, OP_FIXED = 4, OP_BLOB = 5, OP_ENUM = 6,
    OP_RECORD = 7, OP_ARRAY = 8, OP_MAP = 9, OP_NULLABLE = 10, OP_SINGLE = 11, OP_DECIMAL_BYTES = 12,
    OP_DECIMAL_FIXED = 13, OP_COUNT = 14
};
/* Flags (`b`) of OP_BLOB and OP_INT/OP_LONG. */
#define BLOB_TEXT 1        /* a string column: whether it is known UTF-8 is reported (`checked`) */
#define BLOB_LARGE 2       /* int64 offsets (large_string) */
#define INT_UNSIGNED 0x100 /* the low byte is the column's width in bytes */

#define BAD 1 /* the record does not decode */
#define NO_MEMORY -1

typedef struct {
    uint8_t *p;
    size_t len, cap;
} Buf;

/* The Arrow C data interface's array (https://arrow.apache.org/docs/format/CDataInterface.html). */
struct ArrowArray {
    int64_t length, null_count, offset, n_buffers, n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

typedef struct {
    int op;
    int64_t a, b;          /* size, symbol count, null branch, decimal width, flags, ... */
    int64_t first, nchild; /* children: kids[first .. first + nchild) */
    Buf values;            /* fixed-width values, offsets, or one byte per boolean / presence */
    Buf body;              /* the bytes of a blob column */
    Buf bits;              /* packed booleans or validity, made at export */
    int64_t count;         /* values in this column so far */
    int64_t nulls;
} Node;

/* Everything one decoded batch owns; freed when the last exported array is released. */
typedef struct {
    Node *nodes;
    Py_ssize_t nnodes;
    struct ArrowArray *arrays; /* one per node, plus one per map (its entries struct) */
    const void **slots;        /* buffer pointers: 3 per array */
    struct ArrowArray **kids;  /* child pointers */
    Py_ssize_t live;           /* arrays not released yet */
} Holder;

typedef struct {
    const uint8_t *buf;
    Node *nodes;
    const int64_t *kids;
    const uint8_t *symbols;         /* enum symbols' UTF-8 bytes, one after another */
    const int64_t *symbol_offsets;  /* symbol s of an enum node: [a + s, a + s + 1) of these */
    int64_t nsymbol_offsets;
} Decoder;

static int
buf_grow(Buf *b, size_t extra)
{
    size_t cap;
    uint8_t *p;
    if (b->len + extra <= b->cap)
        return 0;
    cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra)
        cap *= 2;
    p = realloc(b->p, cap);
    if (p == NULL)
        return NO_MEMORY;
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int
buf_put(Buf *b, const void *src, size_t size)
{
    if (b->len + size > b->cap && buf_grow(b, size) < 0)
        return NO_MEMORY;
    memcpy(b->p + b->len, src, size);
    b->len += size;
    return 0;
}

static inline int
buf_zeros(Buf *b, size_t size)
{
    if (b->len + size > b->cap && buf_grow(b, size) < 0)
        return NO_MEMORY;
    memset(b->p + b->len, 0, size);
    b->len += size;
    return 0;
}

/* The end offset of a blob, list or map value (int32, or int64 for large strings). */
static inline int
put_offset(Buf *b, int64_t total, int large)
{
    int32_t v;
    if (large)
        return buf_put(b, &total, 8);
    if (total > INT32_MAX)
        return BAD; /* the NumPy decoder raises OverflowError for this batch */
    v = (int32_t)total;
    return buf_put(b, &v, 4);
}

/* A varint of a record ending at `end`, moving *at past it. */
static inline int
varint_next(const uint8_t *buf, int64_t *at, int64_t end, int64_t *value)
{
    int len = 0;
    if (varint_within(buf, *at, end, end, value, &len) != OK)
        return BAD;
    *at += len;
    return OK;
}

/* An int or long as its column holds it: int32/int64, or the narrower integer the column
 * was declared with (`arrow.type`); a value out of the column's range is a problem. */
static inline int
put_integer(Node *nd, int64_t v, int avro_width)
{
    int width = (int)(nd->b & 0xFF);
    if (width == 0)
        width = avro_width;
    if (nd->b & INT_UNSIGNED) {
        if (v < 0 || (width < 8 && v >> (8 * width)))
            return BAD;
    } else if (width < 8) {
        int64_t lim = (int64_t)1 << (8 * width - 1);
        if (v < -lim || v >= lim)
            return BAD;
    }
    switch (width) {
    case 1: {
        int8_t x = (int8_t)v;
        return buf_put(&nd->values, &x, 1);
    }
    case 2: {
        int16_t x = (int16_t)v;
        return buf_put(&nd->values, &x, 2);
    }
    case 4: {
        int32_t x = (int32_t)(uint32_t)v;
        return buf_put(&nd->values, &x, 4);
    }
    default:
        return buf_put(&nd->values, &v, 8);
    }
}

static inline int
int_width(const Node *nd, int avro_width)
{
    int width = (int)(nd->b & 0xFF);
    return width ? width : avro_width;
}

static int decode_value(Decoder *d, int64_t idx, int64_t *at, int64_t end);

/* The slot of a value that is not there (a null of a union, and everything under it): every
 * column then has one value per value of its parent, and a null union takes its child's
 * column as it is, with a validity bitmap. */
static int
put_placeholder(Decoder *d, int64_t idx)
{
    Node *nd = &d->nodes[idx];
    int64_t k;
    int rc = OK;
    nd->count++;
    switch (nd->op) {
    case OP_NULL:
        nd->nulls++;
        return OK;
    case OP_BOOLEAN:
        return buf_zeros(&nd->values, 1);
    case OP_INT:
        return buf_zeros(&nd->values, (size_t)int_width(nd, 4));
    case OP_LONG:
        return buf_zeros(&nd->values, (size_t)int_width(nd, 8));
    case OP_FIXED:
        return buf_zeros(&nd->values, (size_t)nd->a);
    case OP_DECIMAL_BYTES:
        return buf_zeros(&nd->values, (size_t)nd->a);
    case OP_DECIMAL_FIXED:
        return buf_zeros(&nd->values, (size_t)nd->b);
    case OP_BLOB:
    case OP_ENUM:
        return put_offset(&nd->values, (int64_t)nd->body.len, nd->op == OP_BLOB && (nd->b & BLOB_LARGE));
    case OP_RECORD:
        for (k = 0; k < nd->nchild && rc == OK; k++)
            rc = put_placeholder(d, d->kids[nd->first + k]);
        return rc;
    case OP_ARRAY:
    case OP_MAP:
        return put_offset(&nd->values, d->nodes[d->kids[nd->first + nd->nchild - 1]].count, 0);
    case OP_NULLABLE:
        if ((rc = buf_zeros(&nd->values, 1)) != OK)
            return rc;
        nd->nulls++;
        return put_placeholder(d, d->kids[nd->first]);
    case OP_SINGLE:
        return put_placeholder(d, d->kids[nd->first]);
    default:
        return BAD;
    }
}

/* Big-endian two's complement of `len` bytes -> little-endian `width` bytes. */
static int
put_decimal(Buf *b, const uint8_t *src, int64_t len, int64_t width)
{
    uint8_t le[32];
    int64_t k;
    uint8_t sign = src[0] >= 0x80 ? 0xFF : 0;
    for (k = 0; k < width; k++)
        le[k] = k < len ? src[len - 1 - k] : sign;
    return buf_put(b, le, (size_t)width);
}

static int
decode_value(Decoder *d, int64_t idx, int64_t *at, int64_t end)
{
    Node *nd = &d->nodes[idx];
    const uint8_t *buf = d->buf;
    int64_t v, k;
    int rc;

    nd->count++;
    switch (nd->op) {
    case OP_NULL:
        nd->nulls++;
        return OK;
    case OP_BOOLEAN: {
        uint8_t b;
        if (*at >= end || (b = buf[*at]) > 1)
            return BAD;
        *at += 1;
        return buf_put(&nd->values, &b, 1);
    }
    case OP_INT:
        if (varint_next(buf, at, end, &v) != OK || v < INT32_MIN || v > INT32_MAX)
            return BAD;
        return put_integer(nd, v, 4);
    case OP_LONG:
        if (varint_next(buf, at, end, &v) != OK)
            return BAD;
        return put_integer(nd, v, 8);
    case OP_ENUM: {
        /* The column holds the symbol's text. */
        int64_t s;
        if (varint_next(buf, at, end, &v) != OK || v < 0 || v >= nd->b)
            return BAD;
        s = nd->a + v;
        if ((rc = buf_put(&nd->body, d->symbols + d->symbol_offsets[s],
                          (size_t)(d->symbol_offsets[s + 1] - d->symbol_offsets[s]))) != 0)
            return rc;
        return put_offset(&nd->values, (int64_t)nd->body.len, 0);
    }
    case OP_FIXED:
        if (end - *at < nd->a)
            return BAD;
        rc = buf_put(&nd->values, buf + *at, (size_t)nd->a);
        *at += nd->a;
        return rc;
    case OP_BLOB:
        if (length_within(buf, at, end, end, &v) != OK)
            return BAD;
        if ((rc = buf_put(&nd->body, buf + *at, (size_t)v)) != 0)
            return rc;
        *at += v;
        return put_offset(&nd->values, (int64_t)nd->body.len, nd->b & BLOB_LARGE);
    case OP_RECORD:
        for (k = 0; k < nd->nchild; k++) {
            int64_t kid = d->kids[nd->first + k];
            Node *c = &d->nodes[kid];
            /* The usual fields (long, int, string or bytes, double) read here, without a
             * call per field; exactly what decode_value does for them. */
            if ((c->op == OP_LONG || c->op == OP_INT) && c->b == 0) {
                if (varint_next(buf, at, end, &v) != OK)
                    return BAD;
                c->count++;
                if (c->op == OP_LONG) {
                    rc = buf_put(&c->values, &v, 8);
                } else {
                    int32_t x;
                    if (v < INT32_MIN || v > INT32_MAX)
                        return BAD;
                    x = (int32_t)v;
                    rc = buf_put(&c->values, &x, 4);
                }
            } else if (c->op == OP_BLOB) {
                if (length_within(buf, at, end, end, &v) != OK)
                    return BAD;
                c->count++;
                if ((rc = buf_put(&c->body, buf + *at, (size_t)v)) != 0)
                    return rc;
                *at += v;
                rc = put_offset(&c->values, (int64_t)c->body.len, c->b & BLOB_LARGE);
            } else if (c->op == OP_FIXED) {
                if (end - *at < c->a)
                    return BAD;
                c->count++;
                rc = buf_put(&c->values, buf + *at, (size_t)c->a);
                *at += c->a;
            } else {
                rc = decode_value(d, kid, at, end);
            }
            if (rc != OK)
                return rc;
        }
        return OK;
    case OP_ARRAY:
    case OP_MAP: {
        /* One block then the closing 0 (several blocks or sized blocks are not canonical). */
        int64_t item = d->kids[nd->first + nd->nchild - 1];
        if (length_within(buf, at, end, end, &v) != OK)
            return BAD;
        for (k = 0; k < v; k++) {
            if (nd->op == OP_MAP && (rc = decode_value(d, d->kids[nd->first], at, end)) != OK)
                return rc;
            if ((rc = decode_value(d, item, at, end)) != OK)
                return rc;
        }
        if (v > 0) {
            int64_t tail;
            if (varint_next(buf, at, end, &tail) != OK || tail != 0)
                return BAD;
        }
        return put_offset(&nd->values, d->nodes[item].count, 0);
    }
    case OP_NULLABLE: {
        uint8_t present;
        if (varint_next(buf, at, end, &v) != OK || v < 0 || v > 1)
            return BAD;
        present = v != nd->a;
        if ((rc = buf_put(&nd->values, &present, 1)) != 0)
            return rc;
        if (present)
            return decode_value(d, d->kids[nd->first], at, end);
        nd->nulls++;
        return put_placeholder(d, d->kids[nd->first]);
    }
    case OP_SINGLE:
        if (varint_next(buf, at, end, &v) != OK || v != 0)
            return BAD;
        return decode_value(d, d->kids[nd->first], at, end);
    case OP_DECIMAL_BYTES: {
        const uint8_t *src;
        if (varint_next(buf, at, end, &v) != OK || v < 1 || v > nd->a || v > end - *at)
            return BAD;
        src = buf + *at;
        if (v > 1 && ((src[0] == 0 && src[1] < 0x80) || (src[0] == 0xFF && src[1] >= 0x80))) {
            /* Not minimal, except fastavro's -2^(8k-1) with one sign byte too many
             * (ff 80 00 ..), which is accepted as the NumPy decoder accepts it. */
            int fastavro_min = src[0] == 0xFF && src[1] == 0x80;
            for (k = 2; fastavro_min && k < v; k++)
                fastavro_min = src[k] == 0;
            if (!fastavro_min)
                return BAD;
        }
        *at += v;
        return put_decimal(&nd->values, src, v, nd->a);
    }
    case OP_DECIMAL_FIXED:
        if (end - *at < nd->a)
            return BAD;
        rc = put_decimal(&nd->values, buf + *at, nd->a, nd->b);
        *at += nd->a;
        return rc;
    default:
        return BAD;
    }
}

/* ------------------------------------------------------------------ export as Arrow arrays */

static void
holder_free(Holder *h)
{
    Py_ssize_t i;
    if (h == NULL)
        return;
    if (h->nodes != NULL) {
        for (i = 0; i < h->nnodes; i++) {
            free(h->nodes[i].values.p);
            free(h->nodes[i].body.p);
            free(h->nodes[i].bits.p);
        }
        free(h->nodes);
    }
    free(h->arrays);
    free(h->slots);
    free(h->kids);
    free(h);
}

/* Release callback of every exported array: children still held are released with their
 * parent; the batch's memory goes with the last array. */
static void
array_release(struct ArrowArray *array)
{
    Holder *h = (Holder *)array->private_data;
    int64_t k;
    for (k = 0; k < array->n_children; k++) {
        struct ArrowArray *child = array->children[k];
        if (child->release != NULL)
            child->release(child);
    }
    array->release = NULL;
    if (--h->live == 0)
        holder_free(h);
}

/* Bytes (0/1) -> an Arrow bitmap (LSB first); returns the number of zero bytes. */
static int64_t
pack_bits(Buf *bits, const Buf *bytes, int64_t n)
{
    int64_t i, zeros = 0;
    memset(bits->p, 0, (size_t)((n + 7) / 8));
    for (i = 0; i < n; i++) {
        if (bytes->p[i])
            bits->p[i >> 3] |= (uint8_t)(1u << (i & 7));
        else
            zeros++;
    }
    return zeros;
}

/* Fill the exported array of node `idx` (and those below it). Returns the array, or NULL
 * without memory. `next` hands out the extra arrays maps need for their entries. */
static struct ArrowArray *
export_node(Holder *h, const int64_t *kids, int64_t idx, Py_ssize_t *next_extra, Py_ssize_t *next_kid)
{
    Node *nd = &h->nodes[idx];
    struct ArrowArray *a;
    int64_t k;
    static const int64_t empty[2] = {0, 0};

    if (nd->op == OP_SINGLE)
        return export_node(h, kids, kids[nd->first], next_extra, next_kid);
    if (nd->op == OP_NULLABLE) {
        a = export_node(h, kids, kids[nd->first], next_extra, next_kid);
        if (a == NULL)
            return NULL;
        if (nd->nulls > 0 && a->n_buffers > 0) {
            if (buf_grow(&nd->bits, (size_t)((nd->count + 7) / 8)) < 0)
                return NULL;
            a->null_count = pack_bits(&nd->bits, &nd->values, nd->count);
            a->buffers[0] = nd->bits.p;
        }
        return a;
    }
    a = &h->arrays[idx];
    a->length = nd->count;
    a->null_count = 0;
    a->offset = 0;
    a->n_children = 0;
    a->buffers = h->slots + 3 * idx;
    a->children = NULL;
    a->dictionary = NULL;
    a->release = array_release;
    a->private_data = h;
    h->live++;
    a->buffers[0] = NULL;
    a->buffers[1] = nd->values.p ? (const void *)nd->values.p : (const void *)empty;
    a->buffers[2] = nd->body.p ? (const void *)nd->body.p : (const void *)empty;
    switch (nd->op) {
    case OP_NULL:
        a->n_buffers = 0;
        a->null_count = nd->count;
        break;
    case OP_BOOLEAN:
        a->n_buffers = 2;
        if (buf_grow(&nd->bits, (size_t)((nd->count + 7) / 8) + 1) < 0)
            return NULL;
        pack_bits(&nd->bits, &nd->values, nd->count);
        a->buffers[1] = nd->bits.p;
        break;
    case OP_BLOB:
    case OP_ENUM:
        a->n_buffers = 3;
        break;
    case OP_RECORD:
    case OP_ARRAY:
    case OP_MAP:
        a->n_buffers = nd->op == OP_RECORD ? 1 : 2;
        a->children = h->kids + *next_kid;
        if (nd->op == OP_MAP) {
            /* A map is a list of struct<key, value> entries. */
            Py_ssize_t extra = h->nnodes + (*next_extra)++;
            struct ArrowArray *entries = &h->arrays[extra];
            struct ArrowArray *key, *value;
            a->n_children = 1;
            a->children[0] = entries;
            *next_kid += 1;
            key = export_node(h, kids, kids[nd->first], next_extra, next_kid);
            value = export_node(h, kids, kids[nd->first + 1], next_extra, next_kid);
            if (key == NULL || value == NULL)
                return NULL;
            *entries = (struct ArrowArray){key->length, 0, 0, 1, 2, h->slots + 3 * extra,
                                           h->kids + *next_kid, NULL, array_release, h};
            entries->buffers[0] = NULL;
            entries->children[0] = key;
            entries->children[1] = value;
            *next_kid += 2;
            h->live++;
        } else {
            Py_ssize_t base = *next_kid;
            a->n_children = nd->nchild;
            *next_kid += nd->nchild;
            for (k = 0; k < nd->nchild; k++) {
                struct ArrowArray *child = export_node(h, kids, kids[nd->first + k], next_extra, next_kid);
                if (child == NULL)
                    return NULL;
                h->kids[base + k] = child;
            }
        }
        break;
    default: /* fixed-width values */
        a->n_buffers = 2;
        break;
    }
    return a;
}

/* After the first record: room in every column for the rest of the batch at the first
 * record's rate (a little more), so that the buffers are not grown and copied a dozen
 * times each.  A body never needs more than the batch's data; a reservation that fails
 * is left to the growth on demand. */
static void
reserve_for_batch(Node *nodes, Py_ssize_t nnodes, Py_ssize_t n, int64_t data_size)
{
    Py_ssize_t i;
    for (i = 0; i < nnodes; i++) {
        Node *nd = &nodes[i];
        size_t want = nd->values.len + nd->values.len * (size_t)n / 8 + nd->values.len * (size_t)n;
        if (want > nd->values.cap && want <= (size_t)16 * (size_t)data_size + 4096)
            (void)buf_grow(&nd->values, want - nd->values.len);
        want = nd->body.len + nd->body.len * (size_t)n / 8 + nd->body.len * (size_t)n;
        if (want > (size_t)data_size)
            want = (size_t)data_size;
        if (want > nd->body.cap)
            (void)buf_grow(&nd->body, want - nd->body.len);
    }
}

/* Whether s[0 .. len) is all ASCII (then it is well-formed UTF-8, whatever its values'
 * bounds): one pass OR-ing the bytes (the compiler makes it a vector loop). */
static int
all_ascii(const uint8_t *s, int64_t len)
{
    uint8_t seen = 0;
    int64_t i;
    for (i = 0; i < len; i++)
        seen |= s[i];
    return seen < 0x80;
}

/* Whether s[0 .. len) is well-formed UTF-8, 16 bytes at a time: the lookup method of
 * Keiser and Lemire ("Validating UTF-8 in less than one instruction per byte", 2021).
 * Three table lookups (the high nibble of the previous byte, its low nibble, the high
 * nibble of this byte) give the errors each two-byte window may show; a window after a
 * three- or four-byte lead must be a continuation, which is all the lookups cannot see.
 * A zero block after the end catches a sequence the end cuts short. Returns -1 where the
 * CPU lacks SSSE3 (nothing is known then). */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define U8_TOO_SHORT (1 << 0)      /* a lead, then no continuation */
#define U8_TOO_LONG (1 << 1)       /* ASCII, then a continuation */
#define U8_OVERLONG_3 (1 << 2)     /* 11100000 100_____ */
#define U8_TOO_LARGE (1 << 3)      /* above U+10FFFF */
#define U8_SURROGATE (1 << 4)      /* 11101101 101_____ */
#define U8_OVERLONG_2 (1 << 5)     /* 1100000_ 10______ */
#define U8_TOO_LARGE_1000 (1 << 6) /* 11110101 1000____ and above */
#define U8_OVERLONG_4 (1 << 6)     /* 11110000 1000____ */
#define U8_TWO_CONTS (1 << 7)      /* two continuations (allowed only after a 3- or 4-byte lead) */
#define U8_CARRY (U8_TOO_SHORT | U8_TOO_LONG | U8_TWO_CONTS)
#define U8_LARGE (U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000)

__attribute__((target("ssse3"))) static inline __m128i
utf8_errors(__m128i input, __m128i prev_input)
{
    const __m128i nibble = _mm_set1_epi8(0x0F);
    const __m128i byte_1_high = _mm_setr_epi8(
        U8_TOO_LONG, U8_TOO_LONG, U8_TOO_LONG, U8_TOO_LONG, U8_TOO_LONG, U8_TOO_LONG, U8_TOO_LONG, U8_TOO_LONG,
        (char)U8_TWO_CONTS, (char)U8_TWO_CONTS, (char)U8_TWO_CONTS, (char)U8_TWO_CONTS,
        U8_TOO_SHORT | U8_OVERLONG_2, U8_TOO_SHORT, U8_TOO_SHORT | U8_OVERLONG_3 | U8_SURROGATE,
        U8_TOO_SHORT | U8_TOO_LARGE | U8_TOO_LARGE_1000 | U8_OVERLONG_4);
    const __m128i byte_1_low = _mm_setr_epi8(
        (char)(U8_CARRY | U8_OVERLONG_3 | U8_OVERLONG_2 | U8_OVERLONG_4), (char)(U8_CARRY | U8_OVERLONG_2),
        (char)U8_CARRY, (char)U8_CARRY, (char)(U8_CARRY | U8_TOO_LARGE), (char)U8_LARGE, (char)U8_LARGE,
        (char)U8_LARGE, (char)U8_LARGE, (char)U8_LARGE, (char)U8_LARGE, (char)U8_LARGE, (char)U8_LARGE,
        (char)(U8_LARGE | U8_SURROGATE), (char)U8_LARGE, (char)U8_LARGE);
    const __m128i byte_2_high = _mm_setr_epi8(
        U8_TOO_SHORT, U8_TOO_SHORT, U8_TOO_SHORT, U8_TOO_SHORT, U8_TOO_SHORT, U8_TOO_SHORT, U8_TOO_SHORT, U8_TOO_SHORT,
        (char)(U8_TOO_LONG | U8_OVERLONG_2 | U8_TWO_CONTS | U8_OVERLONG_3 | U8_TOO_LARGE_1000 | U8_OVERLONG_4),
        (char)(U8_TOO_LONG | U8_OVERLONG_2 | U8_TWO_CONTS | U8_OVERLONG_3 | U8_TOO_LARGE),
        (char)(U8_TOO_LONG | U8_OVERLONG_2 | U8_TWO_CONTS | U8_SURROGATE | U8_TOO_LARGE),
        (char)(U8_TOO_LONG | U8_OVERLONG_2 | U8_TWO_CONTS | U8_SURROGATE | U8_TOO_LARGE),
        U8_TOO_SHORT, U8_TOO_SHORT, U8_TOO_SHORT, U8_TOO_SHORT);
    __m128i prev1 = _mm_alignr_epi8(input, prev_input, 15);
    __m128i special = _mm_and_si128(
        _mm_and_si128(_mm_shuffle_epi8(byte_1_high, _mm_and_si128(_mm_srli_epi16(prev1, 4), nibble)),
                      _mm_shuffle_epi8(byte_1_low, _mm_and_si128(prev1, nibble))),
        _mm_shuffle_epi8(byte_2_high, _mm_and_si128(_mm_srli_epi16(input, 4), nibble)));
    /* Only 111_____ stays >= 0x80 two bytes back, only 1111____ three bytes back. */
    __m128i third = _mm_subs_epu8(_mm_alignr_epi8(input, prev_input, 14), _mm_set1_epi8(0xE0 - 0x80));
    __m128i fourth = _mm_subs_epu8(_mm_alignr_epi8(input, prev_input, 13), _mm_set1_epi8((char)(0xF0 - 0x80)));
    __m128i must23 = _mm_and_si128(_mm_or_si128(third, fourth), _mm_set1_epi8((char)0x80));
    return _mm_xor_si128(must23, special);
}

__attribute__((target("ssse3"))) static int
utf8_valid_ssse3(const uint8_t *s, int64_t len)
{
    __m128i prev = _mm_setzero_si128(), errors = _mm_setzero_si128(), input;
    uint8_t tail[16];
    int64_t i = 0;
    for (; i + 16 <= len; i += 16) {
        input = _mm_loadu_si128((const __m128i *)(s + i));
        errors = _mm_or_si128(errors, utf8_errors(input, prev));
        prev = input;
    }
    if (i < len) {
        memset(tail, 0, sizeof tail);
        memcpy(tail, s + i, (size_t)(len - i));
        input = _mm_loadu_si128((const __m128i *)tail);
        errors = _mm_or_si128(errors, utf8_errors(input, prev));
        prev = input;
    }
    errors = _mm_or_si128(errors, utf8_errors(_mm_setzero_si128(), prev));
    return _mm_movemask_epi8(_mm_cmpeq_epi8(errors, _mm_setzero_si128())) == 0xFFFF;
}

static int
utf8_valid(const uint8_t *s, int64_t len)
{
    return __builtin_cpu_supports("ssse3") ? utf8_valid_ssse3(s, len) : -1;
}
#else
static int
utf8_valid(const uint8_t *s, int64_t len)
{
    return -1;
}
#endif

/* Whether every value of a string column (its offsets int32 or int64, the first 0 and
 * the last the body's length) is well-formed UTF-8: the body as a whole is, and no value
 * starts with a continuation byte (then each value is whole characters). Every offset in
 * the buffer is looked at, not only the first `count`. 0 also where nothing is known (no
 * vector unit): Arrow's validation checks those. */
static int
text_column_valid(const Node *nd)
{
    const uint8_t *body = nd->body.p;
    const int64_t blen = (int64_t)nd->body.len;
    const int64_t count = (int64_t)(nd->values.len / ((nd->b & BLOB_LARGE) ? 8 : 4));
    int bad = 0;
    int64_t i;
    if (blen == 0)
        return 1;
    if (utf8_valid(body, blen) != 1)
        return 0;
    if (nd->b & BLOB_LARGE) {
        const int64_t *off = (const int64_t *)nd->values.p;
        for (i = 0; i < count; i++)
            bad |= off[i] < blen && (body[off[i]] & 0xC0) == 0x80;
    } else {
        const int32_t *off = (const int32_t *)nd->values.p;
        for (i = 0; i < count; i++)
            bad |= off[i] < blen && (body[off[i]] & 0xC0) == 0x80;
    }
    return !bad;
}

/* Where record i's Avro value lies: [pos[i], end[i]) (int64 positions), or, framed, the
 * value at [offsets[i], offsets[i + 1]) (an Arrow binary column's int32 offsets) after the
 * Confluent wire-format header (magic byte 0, the 4-byte big-endian schema id), which
 * must name `schema_id`. */
typedef struct {
    const int64_t *pos, *end;
    const int32_t *offsets;
    int64_t schema_id;
} Bounds;

#define FRAME_HEADER 5

static inline int
record_bounds(const Bounds *b, const uint8_t *buf, int64_t size, Py_ssize_t i, int64_t *at, int64_t *end)
{
    if (b->offsets == NULL) {
        *at = b->pos[i];
        *end = b->end[i];
        return *at >= 0 && *end >= *at && *end <= size ? OK : BAD;
    } else {
        int64_t s = b->offsets[i], e = b->offsets[i + 1];
        if (s < 0 || e < s || e > size || e - s < FRAME_HEADER || buf[s] != 0)
            return BAD;
        if ((((int64_t)buf[s + 1] << 24) | ((int64_t)buf[s + 2] << 16) | ((int64_t)buf[s + 3] << 8) |
             (int64_t)buf[s + 4]) != b->schema_id)
            return BAD;
        *at = s + FRAME_HEADER;
        *end = e;
        return OK;
    }
}

/* The shared body of decode_batch and decode_framed: a[0..3] are program, symbols, symbol
 * offsets and data; `bounds` says where each of the `n` records lies; `checked` (NULL, or
 * one byte per program entry) gets 1 for each string column (a string, a map key or an
 * enum) known to be well-formed UTF-8 (all ASCII, or a string column checked whole by
 * text_column_valid), 0 for every other entry. */
static PyObject *
decode_records_with(Arg *a, const Bounds *bounds, Py_ssize_t n, Arg *checked)
{
    PyObject *out = NULL;
    Holder *h = NULL;
    Py_ssize_t nnodes = 0, nkids, nmaps = 0, i, bad_record = -1;
    int rc = OK;

    h = calloc(1, sizeof(Holder));
    if (h == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    {
        /* program: int64 header [node count, kid count], then 5 per node (op, a, b, first
         * kid, kid count), then the kids (node indexes). */
        const int64_t *prog = (const int64_t *)a[0].view.buf;
        const int64_t *symoff = (const int64_t *)a[2].view.buf;
        Py_ssize_t plen = a[0].view.len / 8, nsymoff = a[2].view.len / 8;
        Node *nodes;
        for (i = 1; i < nsymoff; i++)
            if (symoff[i] < symoff[i - 1] || symoff[i] > (int64_t)a[1].view.len || symoff[0] < 0) {
                PyErr_SetString(PyExc_ValueError, "malformed symbol offsets");
                goto done;
            }
        if (plen < 2 || prog[0] < 1 || prog[1] < 0 || plen != 2 + 5 * prog[0] + prog[1]) {
            PyErr_SetString(PyExc_ValueError, "malformed schema program");
            goto done;
        }
        if (checked != NULL && checked->view.len != prog[0]) {
            PyErr_SetString(PyExc_ValueError, "checked needs one byte per program entry");
            goto done;
        }
        nnodes = (Py_ssize_t)prog[0];
        nkids = (Py_ssize_t)prog[1];
        h->nnodes = nnodes;
        nodes = h->nodes = calloc((size_t)nnodes, sizeof(Node));
        if (nodes == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (i = 0; i < nnodes; i++) {
            const int64_t *q = prog + 2 + 5 * i;
            int op = (int)q[0];
            Py_ssize_t k;
            nodes[i].op = op;
            nodes[i].a = q[1];
            nodes[i].b = q[2];
            nodes[i].first = q[3];
            nodes[i].nchild = q[4];
            /* Children come after their parent: a program cannot loop. */
            if (q[0] < 0 || q[0] >= OP_COUNT || q[3] < 0 || q[4] < 0 || q[3] + q[4] > nkids ||
                (op == OP_DECIMAL_BYTES && (q[1] < 1 || q[1] > 32)) ||
                (op == OP_DECIMAL_FIXED && (q[1] < 1 || q[1] > q[2] || q[2] > 32)) ||
                (op == OP_FIXED && (q[1] < 0 || q[1] > (1 << 20))) ||
                (op == OP_ENUM && (q[1] < 0 || q[2] < 0 || q[1] + q[2] + 1 > nsymoff)) ||
                ((op == OP_INT || op == OP_LONG) && (q[2] & 0xFF) != 0 && (q[2] & 0xFF) != 1 &&
                 (q[2] & 0xFF) != 2 && (q[2] & 0xFF) != 4 && (q[2] & 0xFF) != 8) ||
                ((op == OP_ARRAY || op == OP_NULLABLE || op == OP_SINGLE) && q[4] != 1) ||
                (op == OP_RECORD && q[4] < 1) || (op == OP_MAP && q[4] != 2) ||
                ((op != OP_RECORD && op != OP_ARRAY && op != OP_MAP && op != OP_NULLABLE && op != OP_SINGLE) && q[4] != 0)) {
                PyErr_SetString(PyExc_ValueError, "malformed schema program");
                goto done;
            }
            for (k = 0; k < q[4]; k++) {
                int64_t kid = prog[2 + 5 * nnodes + q[3] + k];
                if (kid <= i || kid >= nnodes) {
                    PyErr_SetString(PyExc_ValueError, "malformed schema program");
                    goto done;
                }
            }
            nmaps += op == OP_MAP;
            if (op == OP_BLOB || op == OP_ENUM || op == OP_ARRAY || op == OP_MAP) {
                if (put_offset(&nodes[i].values, 0, op == OP_BLOB && (q[2] & BLOB_LARGE)) < 0) {
                    PyErr_NoMemory();
                    goto done;
                }
            }
        }
        /* Each node is the child of one parent at most (a tree), as export needs. */
        {
            int64_t *parents = calloc((size_t)nnodes, sizeof(int64_t));
            int tree = parents != NULL;
            for (i = 0; tree && i < nkids; i++)
                tree = ++parents[prog[2 + 5 * nnodes + i]] == 1;
            free(parents);
            if (!tree) {
                PyErr_SetString(PyExc_ValueError, "malformed schema program");
                goto done;
            }
        }
        {
            Decoder d = {(const uint8_t *)a[3].view.buf, nodes, prog + 2 + 5 * nnodes,
                         (const uint8_t *)a[1].view.buf, symoff, nsymoff};
            const int64_t size = (int64_t)a[3].view.len;
            Py_BEGIN_ALLOW_THREADS
            for (i = 0; i < n; i++) {
                int64_t at = 0, end = 0;
                rc = record_bounds(bounds, d.buf, size, i, &at, &end);
                if (rc == OK)
                    rc = decode_value(&d, 0, &at, end);
                if (rc == OK && at != end)
                    rc = BAD; /* bytes left over: the value does not match its writer schema */
                if (rc != OK) {
                    bad_record = i;
                    break;
                }
                if (i == 0 && n > 1)
                    reserve_for_batch(nodes, nnodes, n - 1, size);
            }
            /* String columns known to be UTF-8 need no check value by value. */
            if (checked != NULL && rc == OK) {
                uint8_t *ok = (uint8_t *)checked->view.buf;
                for (i = 0; i < nnodes; i++) {
                    const Node *nd = &nodes[i];
                    if (nd->op == OP_BLOB && (nd->b & BLOB_TEXT))
                        ok[i] = (uint8_t)(all_ascii(nd->body.p, (int64_t)nd->body.len) || text_column_valid(nd));
                    else if (nd->op == OP_ENUM)
                        ok[i] = (uint8_t)all_ascii(d.symbols + symoff[nd->a], symoff[nd->a + nd->b] - symoff[nd->a]);
                    else
                        ok[i] = 0;
                }
            }
            Py_END_ALLOW_THREADS
        }
        if (rc == NO_MEMORY) {
            PyErr_NoMemory();
            goto done;
        }
        if (bad_record >= 0) {
            out = PyLong_FromSsize_t(-bad_record - 1);
            goto done;
        }
        h->arrays = calloc((size_t)(nnodes + nmaps), sizeof(struct ArrowArray));
        h->slots = calloc((size_t)(3 * (nnodes + nmaps)), sizeof(void *));
        h->kids = calloc((size_t)(nkids + 2 * nmaps + 1), sizeof(struct ArrowArray *));
        if (h->arrays == NULL || h->slots == NULL || h->kids == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        {
            Py_ssize_t next_extra = 0, next_kid = 0;
            struct ArrowArray *root = export_node(h, prog + 2 + 5 * nnodes, 0, &next_extra, &next_kid);
            if (root == NULL) {
                /* Arrays already filled point at the holder: release through the root. */
                PyErr_NoMemory();
                h->live = 0;
                goto done;
            }
            out = PyLong_FromVoidPtr(root); /* a union at the root hands out the array it wraps */
            if (out == NULL) {
                root->release(root);
                h = NULL;
                goto done;
            }
            h = NULL; /* owned by the exported arrays now */
        }
    }
done:
    if (h != NULL && h->live == 0)
        holder_free(h);
    return out;
}

static PyObject *
decode_batch(PyObject *self, PyObject *args)
{
    PyObject *o[7] = {NULL}, *out = NULL;
    Arg a[7];
    Bounds bounds = {NULL, NULL, NULL, -1};

    memset(a, 0, sizeof a);
    if (!PyArg_ParseTuple(args, "OOOOOO|O:decode_batch", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6]))
        return NULL;
    if (arg_get(&a[0], o[0], 0, 8, "program") < 0 || arg_get(&a[1], o[1], 0, 1, "symbols") < 0 ||
        arg_get(&a[2], o[2], 0, 8, "symbol offsets") < 0 || arg_get(&a[3], o[3], 0, 1, "data") < 0 ||
        arg_get(&a[4], o[4], 0, 8, "pos") < 0 || arg_get(&a[5], o[5], 0, 8, "end") < 0 ||
        (o[6] != NULL && arg_get(&a[6], o[6], 1, 1, "checked") < 0))
        goto done;
    if (a[5].view.len != a[4].view.len) {
        PyErr_SetString(PyExc_ValueError, "pos and end must have one item per record");
        goto done;
    }
    bounds.pos = (const int64_t *)a[4].view.buf;
    bounds.end = (const int64_t *)a[5].view.buf;
    out = decode_records_with(a, &bounds, a[4].view.len / 8, o[6] != NULL ? &a[6] : NULL);
done:
    args_release(a, 7);
    return out;
}

static PyObject *
decode_framed(PyObject *self, PyObject *args)
{
    PyObject *o[6] = {NULL}, *out = NULL;
    Arg a[6];
    long long schema_id;
    Bounds bounds = {NULL, NULL, NULL, -1};

    memset(a, 0, sizeof a);
    if (!PyArg_ParseTuple(args, "OOOOOL|O:decode_framed", &o[0], &o[1], &o[2], &o[3], &o[4], &schema_id, &o[5]))
        return NULL;
    if (arg_get(&a[0], o[0], 0, 8, "program") < 0 || arg_get(&a[1], o[1], 0, 1, "symbols") < 0 ||
        arg_get(&a[2], o[2], 0, 8, "symbol offsets") < 0 || arg_get(&a[3], o[3], 0, 1, "data") < 0 ||
        arg_get(&a[4], o[4], 0, 4, "offsets") < 0 || (o[5] != NULL && arg_get(&a[5], o[5], 1, 1, "checked") < 0))
        goto done;
    if (a[4].view.len < 4) {
        PyErr_SetString(PyExc_ValueError, "offsets need one item more than records");
        goto done;
    }
    bounds.offsets = (const int32_t *)a[4].view.buf;
    bounds.schema_id = schema_id;
    out = decode_records_with(a, &bounds, a[4].view.len / 4 - 1, o[5] != NULL ? &a[5] : NULL);
done:
    args_release(a, 6);
    return out;
}

PyDoc_STRVAR(decode_batch_doc,
"decode_batch(program, symbols, symbol_offsets, data, pos, end[, checked]) -> int\n\n"
"Decode one Avro value per record at [pos[i], end[i]) of data (uint8) with a schema\n"
"program (int64, built by avro_binary; enum symbols as UTF-8 bytes with int64 offsets).\n"
"Returns the address of an Arrow C data interface array holding the column (import it\n"
"with pyarrow.Array._import_from_c and the column's type), or, when a record does not\n"
"decode (any problem, or bytes left over), that record's index as a negative number - 1.\n"
"checked (uint8, one per program entry, written when the batch decodes): 1 for each\n"
"string column (string, map key, enum) known to be well-formed UTF-8 (all ASCII, or\n"
"checked whole in the pass), so that it needs no check value by value; 0 elsewhere.");

PyDoc_STRVAR(decode_framed_doc,
"decode_framed(program, symbols, symbol_offsets, data, offsets, schema_id[, checked]) -> int\n\n"
"decode_batch for values in the Confluent wire format, read straight from a binary\n"
"column's buffers: record i is [offsets[i], offsets[i + 1]) of data (offsets: int32, one\n"
"more than records), a header (magic byte 0, the 4-byte big-endian schema id, which must\n"
"be schema_id) then the Avro value. A record without that header counts as one that\n"
"does not decode. Returns what decode_batch returns.");

static PyMethodDef methods[] = {
    {"read_varints", read_varints, METH_VARARGS, read_varints_doc},
    {"read_blobs", read_blobs, METH_VARARGS, read_blobs_doc},
    {"decode_batch", decode_batch, METH_VARARGS, decode_batch_doc},
    {"decode_framed", decode_framed, METH_VARARGS, decode_framed_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_avro", "Compiled steps of the columnar Avro decoder.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__avro(void)
{
    return PyModule_Create(&module);
}
