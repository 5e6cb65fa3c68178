/* Compiled steps of the KV tablet's batch reads: storage keys of integer key columns,
 * and the conversions between Arrow binary buffers and the lists of bytes the RocksDB
 * binding takes and gives, done in one pass each (kv/batch_io.py holds the NumPy and
 * pyarrow reference of every function and the fallback when this module is absent). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static int
get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (itemsize > 1 && view->len % itemsize != 0) {
        PyErr_Format(PyExc_ValueError, "%s: a whole number of %zd-byte items expected", what, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* The int32 offsets and the data of a binary array, and a third buffer of `itemsize`-byte
 * items (`what`) the function reads beside them; on failure none is held. */
static int
get_binary_and(PyObject *o_off, PyObject *o_data, PyObject *o_third, Py_buffer *off, Py_buffer *data,
               Py_buffer *third, Py_ssize_t itemsize, const char *what)
{
    if (get_buffer(o_off, off, 4, "offsets") < 0)
        return -1;
    if (get_buffer(o_data, data, 1, "data") < 0) {
        PyBuffer_Release(off);
        return -1;
    }
    if (o_third != NULL && get_buffer(o_third, third, itemsize, what) < 0) {
        PyBuffer_Release(off);
        PyBuffer_Release(data);
        return -1;
    }
    return 0;
}

/* Whether value j of a binary array of n values (offsets o, data of data_len bytes) lies
 * inside its buffers; sets IndexError when not. */
static int
value_in_bounds(const int32_t *o, Py_ssize_t n, Py_ssize_t data_len, int64_t j)
{
    if (j < 0 || j >= n || o[j] < 0 || o[j + 1] < o[j] || o[j + 1] > data_len) {
        PyErr_Format(PyExc_IndexError, "position %lld is outside the %zd values", (long long)j, n);
        return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------ keys */

static PyObject *
encode_long_keys(PyObject *self, PyObject *args)
{
    PyObject *prefix_obj, *columns;
    Py_buffer prefix, *cols = NULL;
    Py_ssize_t ncols, n = -1, i, c, held = 0;
    PyObject *offsets = NULL, *data = NULL, *result = NULL;

    if (!PyArg_ParseTuple(args, "OO!:encode_long_keys", &prefix_obj, &PyList_Type, &columns))
        return NULL;
    if (get_buffer(prefix_obj, &prefix, 1, "prefix") < 0)
        return NULL;
    ncols = PyList_GET_SIZE(columns);
    cols = PyMem_Calloc((size_t)(ncols ? ncols : 1), sizeof(Py_buffer));
    if (cols == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (c = 0; c < ncols; c++) {
        if (get_buffer(PyList_GET_ITEM(columns, c), &cols[c], 8, "column") < 0)
            goto done;
        held++;
        if (n < 0)
            n = cols[c].len / 8;
        else if (cols[c].len / 8 != n) {
            PyErr_SetString(PyExc_ValueError, "key columns of different lengths");
            goto done;
        }
    }
    if (n < 0)
        n = 0;
    offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * 4);
    if (offsets == NULL)
        goto done;
    {
        /* Worst case 10 bytes a column (a 64-bit varint): one allocation, trimmed after. */
        Py_ssize_t cap = n * (prefix.len + 10 * ncols);
        int32_t *off = (int32_t *)PyBytes_AS_STRING(offsets);
        uint8_t *out;
        Py_ssize_t at = 0;
        if (cap > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "keys larger than 2 GiB");
            goto done;
        }
        data = PyBytes_FromStringAndSize(NULL, cap ? cap : 1);
        if (data == NULL)
            goto done;
        out = (uint8_t *)PyBytes_AS_STRING(data);
        for (i = 0; i < n; i++) {
            off[i] = (int32_t)at;
            memcpy(out + at, prefix.buf, (size_t)prefix.len);
            at += prefix.len;
            for (c = 0; c < ncols; c++) {
                int64_t v = ((const int64_t *)cols[c].buf)[i];
                uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
                while (z > 0x7F) {
                    out[at++] = (uint8_t)((z & 0x7F) | 0x80);
                    z >>= 7;
                }
                out[at++] = (uint8_t)z;
            }
        }
        off[n] = (int32_t)at;
        if (_PyBytes_Resize(&data, at ? at : 1) < 0)
            goto done;
        result = Py_BuildValue("(OOn)", offsets, data, at);
    }
done:
    Py_XDECREF(offsets);
    Py_XDECREF(data);
    for (c = 0; c < held; c++)
        PyBuffer_Release(&cols[c]);
    PyMem_Free(cols);
    PyBuffer_Release(&prefix);
    return result;
}

PyDoc_STRVAR(encode_long_keys_doc,
"encode_long_keys(prefix, columns) -> (offsets, data, size)\n\n"
"Per row: prefix, then each column's value (int64 buffers, one per key column) as an\n"
"Avro zig-zag varint. offsets: int32 (rows + 1) as bytes; data: the keys, `size` bytes.");

/* ------------------------------------------------------------------ binary <-> lists */

static PyObject *
gather_bytes(PyObject *self, PyObject *args)
{
    PyObject *o_off, *o_data, *o_order, *list = NULL;
    Py_buffer off, data, order;
    Py_ssize_t n, count, i;

    if (!PyArg_ParseTuple(args, "OOO:gather_bytes", &o_off, &o_data, &o_order))
        return NULL;
    if (get_binary_and(o_off, o_data, o_order, &off, &data, &order, 8, "order") < 0)
        return NULL;
    n = off.len / 4 - 1;
    count = order.len / 8;
    {
        const int32_t *o = (const int32_t *)off.buf;
        const int64_t *ord = (const int64_t *)order.buf;
        const char *d = (const char *)data.buf;
        list = PyList_New(count);
        if (list == NULL)
            goto done;
        for (i = 0; i < count; i++) {
            int64_t j = ord[i];
            PyObject *b;
            if (!value_in_bounds(o, n, data.len, j)) {
                Py_CLEAR(list);
                goto done;
            }
            b = PyBytes_FromStringAndSize(d + o[j], o[j + 1] - o[j]);
            if (b == NULL) {
                Py_CLEAR(list);
                goto done;
            }
            PyList_SET_ITEM(list, i, b);
        }
    }
done:
    PyBuffer_Release(&off);
    PyBuffer_Release(&data);
    PyBuffer_Release(&order);
    return list;
}

PyDoc_STRVAR(gather_bytes_doc,
"gather_bytes(offsets, data, order) -> list[bytes]\n\n"
"The values order[0], order[1], ... of a binary array given as its int32 offsets and\n"
"data buffers (order: int64 positions).");

static PyObject *
take_binary(PyObject *self, PyObject *args)
{
    PyObject *o_off, *o_data, *o_rows, *offsets = NULL, *body = NULL, *result = NULL;
    Py_buffer off, data, rows;
    Py_ssize_t n, count, i, total = 0;

    if (!PyArg_ParseTuple(args, "OOO:take_binary", &o_off, &o_data, &o_rows))
        return NULL;
    if (get_binary_and(o_off, o_data, o_rows, &off, &data, &rows, 8, "rows") < 0)
        return NULL;
    n = off.len / 4 - 1;
    count = rows.len / 8;
    {
        const int32_t *o = (const int32_t *)off.buf;
        const int64_t *r = (const int64_t *)rows.buf;
        for (i = 0; i < count; i++) {
            int64_t j = r[i];
            if (!value_in_bounds(o, n, data.len, j))
                goto done;
            total += o[j + 1] - o[j];
        }
        offsets = PyBytes_FromStringAndSize(NULL, (count + 1) * 4);
        body = PyBytes_FromStringAndSize(NULL, total ? total : 1);
        if (offsets == NULL || body == NULL)
            goto done;
        {
            int32_t *out_off = (int32_t *)PyBytes_AS_STRING(offsets);
            char *out = PyBytes_AS_STRING(body);
            const char *d = (const char *)data.buf;
            Py_ssize_t pos = 0;
            for (i = 0; i < count; i++) {
                int64_t j = r[i];
                Py_ssize_t len = o[j + 1] - o[j];
                out_off[i] = (int32_t)pos;
                memcpy(out + pos, d + o[j], (size_t)len);
                pos += len;
            }
            out_off[count] = (int32_t)pos;
        }
        result = Py_BuildValue("(OO)", offsets, body);
    }
done:
    Py_XDECREF(offsets);
    Py_XDECREF(body);
    PyBuffer_Release(&off);
    PyBuffer_Release(&data);
    PyBuffer_Release(&rows);
    return result;
}

PyDoc_STRVAR(take_binary_doc,
"take_binary(offsets, data, rows) -> (offsets, data)\n\n"
"The buffers of the binary array holding values rows[0], rows[1], ... (int64 positions)\n"
"of one given as its int32 offsets and data (no nulls).");

static PyObject *
scatter_bytes(PyObject *self, PyObject *args)
{
    PyObject *values, *o_order, *offsets = NULL, *data = NULL, *validity = NULL, *result = NULL;
    Py_buffer order;
    Py_ssize_t n, i, nulls = 0, total = 0;
    Py_ssize_t *at = NULL; /* per output position: the input index, or -1 */

    if (!PyArg_ParseTuple(args, "O!O:scatter_bytes", &PyList_Type, &values, &o_order))
        return NULL;
    n = PyList_GET_SIZE(values);
    if (o_order == Py_None) {
        memset(&order, 0, sizeof order);
    } else {
        if (get_buffer(o_order, &order, 8, "order") < 0)
            return NULL;
        if (order.len / 8 != n) {
            PyErr_SetString(PyExc_ValueError, "order needs one position per value");
            goto done;
        }
    }
    at = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n ? n : 1));
    if (at == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < n; i++)
        at[i] = -1;
    for (i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        int64_t p = order.buf ? ((const int64_t *)order.buf)[i] : i;
        if (p < 0 || p >= n || at[p] != -1) {
            PyErr_SetString(PyExc_ValueError, "order is not a permutation of the values' positions");
            goto done;
        }
        at[p] = i;
        if (v == Py_None)
            nulls++;
        else if (PyBytes_Check(v))
            total += PyBytes_GET_SIZE(v);
        else {
            PyErr_Format(PyExc_TypeError, "value %zd is %.50s, not bytes or None", i, Py_TYPE(v)->tp_name);
            goto done;
        }
    }
    if (total > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "values larger than 2 GiB");
        goto done;
    }
    offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * 4);
    data = PyBytes_FromStringAndSize(NULL, total ? total : 1);
    if (offsets == NULL || data == NULL)
        goto done;
    if (nulls) {
        validity = PyBytes_FromStringAndSize(NULL, (n + 7) / 8 ? (n + 7) / 8 : 1);
        if (validity == NULL)
            goto done;
        memset(PyBytes_AS_STRING(validity), 0, (size_t)((n + 7) / 8 ? (n + 7) / 8 : 1));
    } else {
        validity = Py_None;
        Py_INCREF(validity);
    }
    {
        int32_t *off = (int32_t *)PyBytes_AS_STRING(offsets);
        char *out = PyBytes_AS_STRING(data);
        uint8_t *bits = nulls ? (uint8_t *)PyBytes_AS_STRING(validity) : NULL;
        Py_ssize_t pos = 0;
        for (i = 0; i < n; i++) {
            PyObject *v = PyList_GET_ITEM(values, at[i]);
            off[i] = (int32_t)pos;
            if (v != Py_None) {
                Py_ssize_t len = PyBytes_GET_SIZE(v);
                memcpy(out + pos, PyBytes_AS_STRING(v), (size_t)len);
                pos += len;
                if (bits)
                    bits[i >> 3] |= (uint8_t)(1u << (i & 7));
            }
        }
        off[n] = (int32_t)pos;
    }
    result = Py_BuildValue("(OOOn)", validity, offsets, data, nulls);
done:
    Py_XDECREF(offsets);
    Py_XDECREF(data);
    Py_XDECREF(validity);
    PyMem_Free(at);
    if (order.buf)
        PyBuffer_Release(&order);
    return result;
}

PyDoc_STRVAR(scatter_bytes_doc,
"scatter_bytes(values, order) -> (validity, offsets, data, null_count)\n\n"
"The buffers of a binary array whose position order[i] holds values[i] (bytes or None;\n"
"order: int64, a permutation, or None for the values' own order). validity: the bitmap\n"
"as bytes, or None without nulls; offsets: int32 as bytes.");

/* ------------------------------------------------------------------ key order */

static PyObject *
key_prefixes(PyObject *self, PyObject *args)
{
    PyObject *o_off, *o_data, *out = NULL;
    Py_buffer off, data;
    Py_ssize_t skip, n, i;

    if (!PyArg_ParseTuple(args, "OOn:key_prefixes", &o_off, &o_data, &skip))
        return NULL;
    if (get_binary_and(o_off, o_data, NULL, &off, &data, NULL, 1, NULL) < 0)
        return NULL;
    n = off.len / 4 - 1;
    if (n < 0)
        n = 0;
    out = PyBytes_FromStringAndSize(NULL, n ? n * 8 : 1);
    if (out != NULL) {
        const int32_t *o = (const int32_t *)off.buf;
        const uint8_t *d = (const uint8_t *)data.buf;
        uint64_t *p = (uint64_t *)PyBytes_AS_STRING(out);
        for (i = 0; i < n; i++) {
            int64_t start = (int64_t)o[i] + skip, end = o[i + 1];
            uint64_t v = 0;
            int k;
            if (o[i] < 0 || end < o[i] || end > data.len) {
                PyErr_Format(PyExc_ValueError, "value %zd lies outside the data buffer", i);
                Py_CLEAR(out);
                break;
            }
            for (k = 0; k < 8; k++)
                v = (v << 8) | (start + k < end ? d[start + k] : 0);
            p[i] = v;
        }
    }
    PyBuffer_Release(&off);
    PyBuffer_Release(&data);
    return out;
}

PyDoc_STRVAR(key_prefixes_doc,
"key_prefixes(offsets, data, skip) -> bytes\n\n"
"Per value of a binary array (int32 offsets, data): its bytes from `skip` on, the first\n"
"eight read as a big-endian uint64 (zero-padded), as native uint64s: their order is the\n"
"values' byte order up to ties of values longer than skip + 8 bytes.");

/* ------------------------------------------------------------------ bucket hashes */

static inline uint8_t
byte_at(const uint8_t *head, Py_ssize_t hlen, const uint8_t *body, Py_ssize_t i)
{
    return i < hlen ? head[i] : body[i - hlen];
}

static PyObject *
murmur2_keys(PyObject *self, PyObject *args)
{
    PyObject *o_off, *o_data, *o_head, *out = NULL;
    Py_buffer off, data, head;
    Py_ssize_t skip, n, i;

    if (!PyArg_ParseTuple(args, "OOnO:murmur2_keys", &o_off, &o_data, &skip, &o_head))
        return NULL;
    if (get_binary_and(o_off, o_data, o_head, &off, &data, &head, 1, "header") < 0)
        return NULL;
    n = off.len / 4 - 1;
    if (n < 0)
        n = 0;
    out = PyBytes_FromStringAndSize(NULL, n ? n * 4 : 1);
    if (out != NULL) {
        const int32_t *o = (const int32_t *)off.buf;
        const uint8_t *d = (const uint8_t *)data.buf, *hd = (const uint8_t *)head.buf;
        uint32_t *res = (uint32_t *)PyBytes_AS_STRING(out);
        const uint32_t m = 0x5bd1e995u;
        for (i = 0; i < n; i++) {
            Py_ssize_t start = (Py_ssize_t)o[i] + skip, end = o[i + 1], len, words, w, t;
            const uint8_t *body = d + start;
            uint32_t h;
            if (o[i] < 0 || end > data.len || start > end) {
                PyErr_Format(PyExc_ValueError, "value %zd lies outside the data buffer or is shorter than %zd bytes",
                             i, skip);
                Py_CLEAR(out);
                break;
            }
            len = head.len + (end - start);
            h = 0x9747b28cu ^ (uint32_t)len;
            words = len / 4;
            for (w = 0; w < words; w++) {
                Py_ssize_t p = 4 * w;
                uint32_t k = (uint32_t)byte_at(hd, head.len, body, p) | ((uint32_t)byte_at(hd, head.len, body, p + 1) << 8) |
                             ((uint32_t)byte_at(hd, head.len, body, p + 2) << 16) |
                             ((uint32_t)byte_at(hd, head.len, body, p + 3) << 24);
                k *= m;
                k ^= k >> 24;
                k *= m;
                h *= m;
                h ^= k;
            }
            t = len % 4;
            if (t >= 3)
                h ^= (uint32_t)byte_at(hd, head.len, body, words * 4 + 2) << 16;
            if (t >= 2)
                h ^= (uint32_t)byte_at(hd, head.len, body, words * 4 + 1) << 8;
            if (t >= 1) {
                h ^= (uint32_t)byte_at(hd, head.len, body, words * 4);
                h *= m;
            }
            h ^= h >> 13;
            h *= m;
            h ^= h >> 15;
            res[i] = h;
        }
    }
    PyBuffer_Release(&off);
    PyBuffer_Release(&data);
    PyBuffer_Release(&head);
    return out;
}

PyDoc_STRVAR(murmur2_keys_doc,
"murmur2_keys(offsets, data, skip, header) -> bytes\n\n"
"Kafka's murmur2 (native uint32s) of each binary value (int32 offsets, data) with its\n"
"first `skip` bytes replaced by `header`, without building the replaced values.");

static PyMethodDef methods[] = {
    {"encode_long_keys", encode_long_keys, METH_VARARGS, encode_long_keys_doc},
    {"gather_bytes", gather_bytes, METH_VARARGS, gather_bytes_doc},
    {"take_binary", take_binary, METH_VARARGS, take_binary_doc},
    {"scatter_bytes", scatter_bytes, METH_VARARGS, scatter_bytes_doc},
    {"key_prefixes", key_prefixes, METH_VARARGS, key_prefixes_doc},
    {"murmur2_keys", murmur2_keys, METH_VARARGS, murmur2_keys_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kvbatch", "Compiled steps of the KV tablet's batch reads.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__kvbatch(void)
{
    return PyModule_Create(&module);
}
