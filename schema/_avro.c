/* Compiled step of the columnar Avro decoder (schema/avro_binary.py).
 *
 * read_varints() reads one zig-zag varint per record from a shared data buffer: the
 * step every Avro int, long, length, count and enum index goes through.  The Python
 * decoder stays the reference (and the fallback without a compiler); this function gives
 * the same values, positions and first problem per record, in one pass over the records
 * instead of one NumPy pass per byte position.  Input is untrusted: reads are bounded by
 * the data buffer and checked against each record's end.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Status codes, mirrored by avro_binary._VARINT_PROBLEMS. */
enum { OK = 0, PAST_END = 1, NON_CANONICAL = 2, TOO_LONG = 3, MALFORMED = 4, NEGATIVE_LENGTH = 5, LONG_LENGTH = 6 };

static int
get(PyObject *obj, Py_buffer *view, int flags, Py_ssize_t itemsize, const char *what)
{
    if (PyObject_GetBuffer(obj, view, flags | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: items of %zd bytes expected", what, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* One varint at `at` (a record ending at `end`): its value and the position after it, or
 * a problem, value 0 and the record's end as the position (where a failed record parks). */
static inline int
varint_at(const uint8_t *buf, int64_t size, int64_t at, int64_t end, int64_t *value, int64_t *next)
{
    uint64_t zz = 0;
    int k, len = 0, problem = OK;
    if (at < 0 || at >= size) {
        problem = PAST_END;
    } else {
        for (k = 0; k < 10; k++) {
            uint8_t b;
            if (at + k >= size) {
                problem = PAST_END;
                break;
            }
            b = buf[at + k];
            zz |= (uint64_t)(b & 0x7F) << (7 * k);
            if (b < 0x80) {
                len = k + 1;
                if (k > 0 && b == 0)
                    problem = NON_CANONICAL;
                else if (k == 9 && b > 1)
                    problem = TOO_LONG;
                break;
            }
            if (k == 9)
                problem = TOO_LONG; /* a tenth byte with more to come */
        }
        if (problem == OK && len == 0)
            problem = MALFORMED;
        if (problem == OK && at + len > end)
            problem = PAST_END;
    }
    if (problem != OK) {
        *value = 0;
        *next = end;
    } else {
        *value = (int64_t)(zz >> 1) ^ -(int64_t)(zz & 1);
        *next = at + len;
    }
    return problem;
}

static PyObject *
read_varints(PyObject *self, PyObject *args)
{
    PyObject *data_obj, *pos_obj, *end_obj, *values_obj, *status_obj;
    Py_buffer data = {0}, pos = {0}, end = {0}, values = {0}, status = {0};
    Py_ssize_t n, i, failed = 0;
    PyObject *result = NULL;

    if (!PyArg_ParseTuple(args, "OOOOO:read_varints", &data_obj, &pos_obj, &end_obj, &values_obj, &status_obj))
        return NULL;
    if (get(data_obj, &data, PyBUF_SIMPLE, 1, "data") < 0)
        return NULL;
    if (get(pos_obj, &pos, PyBUF_WRITABLE | PyBUF_FORMAT, 8, "pos") < 0)
        goto done;
    if (get(end_obj, &end, PyBUF_FORMAT, 8, "end") < 0)
        goto done;
    if (get(values_obj, &values, PyBUF_WRITABLE | PyBUF_FORMAT, 8, "values") < 0)
        goto done;
    if (get(status_obj, &status, PyBUF_WRITABLE | PyBUF_FORMAT, 1, "status") < 0)
        goto done;
    n = pos.len / 8;
    if (end.len / 8 != n || values.len / 8 != n || status.len != n) {
        PyErr_SetString(PyExc_ValueError, "pos, end, values and status must have one item per record");
        goto done;
    }
    {
        const uint8_t *buf = (const uint8_t *)data.buf;
        const int64_t size = (int64_t)data.len;
        int64_t *p = (int64_t *)pos.buf;
        const int64_t *e = (const int64_t *)end.buf;
        int64_t *v = (int64_t *)values.buf;
        int8_t *st = (int8_t *)status.buf;
        Py_BEGIN_ALLOW_THREADS
        for (i = 0; i < n; i++) {
            int64_t value;
            int problem = varint_at(buf, size, p[i], e[i], &value, &p[i]);
            st[i] = (int8_t)problem;
            v[i] = value;
            failed += problem != OK;
        }
        Py_END_ALLOW_THREADS
    }
    result = PyLong_FromSsize_t(failed);
done:
    if (data.obj)
        PyBuffer_Release(&data);
    if (pos.obj)
        PyBuffer_Release(&pos);
    if (end.obj)
        PyBuffer_Release(&end);
    if (values.obj)
        PyBuffer_Release(&values);
    if (status.obj)
        PyBuffer_Release(&status);
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
    PyObject *data_obj, *pos_obj, *end_obj, *offsets_obj, *status_obj, *body = NULL;
    Py_buffer data = {0}, pos = {0}, end = {0}, offsets = {0}, status = {0};
    Py_ssize_t n, i, failed = 0;
    int64_t *starts = NULL, total = 0;
    PyObject *result = NULL;

    if (!PyArg_ParseTuple(args, "OOOOO:read_blobs", &data_obj, &pos_obj, &end_obj, &offsets_obj, &status_obj))
        return NULL;
    if (get(data_obj, &data, PyBUF_SIMPLE, 1, "data") < 0)
        return NULL;
    if (get(pos_obj, &pos, PyBUF_WRITABLE | PyBUF_FORMAT, 8, "pos") < 0)
        goto done;
    if (get(end_obj, &end, PyBUF_FORMAT, 8, "end") < 0)
        goto done;
    if (get(offsets_obj, &offsets, PyBUF_WRITABLE | PyBUF_FORMAT, 4, "offsets") < 0)
        goto done;
    if (get(status_obj, &status, PyBUF_WRITABLE | PyBUF_FORMAT, 1, "status") < 0)
        goto done;
    n = pos.len / 8;
    if (end.len / 8 != n || offsets.len / 4 != n + 1 || status.len != n) {
        PyErr_SetString(PyExc_ValueError, "pos, end, status need one item per record and offsets one more");
        goto done;
    }
    starts = PyMem_Malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    if (starts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    {
        const uint8_t *buf = (const uint8_t *)data.buf;
        const int64_t size = (int64_t)data.len;
        int64_t *p = (int64_t *)pos.buf;
        const int64_t *e = (const int64_t *)end.buf;
        int32_t *off = (int32_t *)offsets.buf;
        int8_t *st = (int8_t *)status.buf;
        char *out;
        off[0] = 0;
        for (i = 0; i < n; i++) {
            int64_t length, at;
            int problem = varint_at(buf, size, p[i], e[i], &length, &at);
            if (problem == OK && length < 0)
                problem = NEGATIVE_LENGTH;
            else if (problem == OK && length > e[i] - at)
                problem = LONG_LENGTH;
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
    if (data.obj)
        PyBuffer_Release(&data);
    if (pos.obj)
        PyBuffer_Release(&pos);
    if (end.obj)
        PyBuffer_Release(&end);
    if (offsets.obj)
        PyBuffer_Release(&offsets);
    if (status.obj)
        PyBuffer_Release(&status);
    return result;
}

PyDoc_STRVAR(read_blobs_doc,
"read_blobs(data, pos, end, offsets, status) -> (int, bytes)\n\n"
"Read one length-prefixed byte string per record (Avro bytes/string): offsets (int32,\n"
"one more than records) and the returned body hold them as an Arrow binary column;\n"
"pos[i] moves past each. A record with a problem (status 1-4 as read_varints for the\n"
"length, 5 negative length, 6 length past the record's end) gets an empty value and\n"
"pos[i] = end[i]. Returns the number of records with a problem and the body.");

static PyMethodDef methods[] = {
    {"read_varints", read_varints, METH_VARARGS, read_varints_doc},
    {"read_blobs", read_blobs, METH_VARARGS, read_blobs_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_avro", "Compiled step of the columnar Avro decoder.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__avro(void)
{
    return PyModule_Create(&module);
}
