/* The common produce request read in one compiled pass (see protocol/produce_request.py).
 *
 * Many small producers send thousands of requests a second that all look alike: Produce
 * v3-12, one topic, one partition, one record batch. read_one_partition() reads such a
 * request's header and body without building any object but the few values it returns;
 * anything else (another API, another shape, anything malformed) returns None, and the
 * general Python decoders then read the request and give the errors they always gave.
 * Input is untrusted: every read is bounds-checked against the frame's end.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define FIRST_VERSION 3
#define LAST_VERSION 12
#define FIRST_FLEXIBLE 9

typedef struct {
    const uint8_t *buf;
    Py_ssize_t pos, end;
} Reader;

/* An unsigned varint of at most 5 bytes (as the Python readers accept); -1 when not. */
static int64_t uvarint(Reader *r) {
    uint32_t result = 0;
    for (int shift = 0; shift <= 28; shift += 7) {
        if (r->pos >= r->end) return -1;
        uint8_t b = r->buf[r->pos++];
        result |= (uint32_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return result;
    }
    return -1;
}

static int int16(Reader *r, int16_t *out) {
    if (r->end - r->pos < 2) return -1;
    *out = (int16_t)((r->buf[r->pos] << 8) | r->buf[r->pos + 1]);
    r->pos += 2;
    return 0;
}

static int int32(Reader *r, int32_t *out) {
    if (r->end - r->pos < 4) return -1;
    const uint8_t *p = r->buf + r->pos;
    *out = (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
    r->pos += 4;
    return 0;
}

/* A length: compact (stored plus one) in flexible versions, else int16/int32; -1 is null,
 * -2 malformed. */
static Py_ssize_t length(Reader *r, int flexible, int wide) {
    if (flexible) {
        int64_t n = uvarint(r);
        return n < 0 ? -2 : (Py_ssize_t)n - 1;
    }
    if (wide) {
        int32_t n;
        if (int32(r, &n) < 0) return -2;
        return n < -1 ? -2 : n;
    }
    int16_t n;
    if (int16(r, &n) < 0) return -2;
    return n < -1 ? -2 : n;
}

static int skip_tags(Reader *r) {
    int64_t count = uvarint(r);
    if (count < 0) return -1;
    for (int64_t i = 0; i < count; i++) {
        if (uvarint(r) < 0) return -1;
        int64_t size = uvarint(r);
        if (size < 0 || size > r->end - r->pos) return -1;
        r->pos += size;
    }
    return 0;
}

/* A string of n bytes at the reader (strict UTF-8); NULL (no error set) when not. */
static PyObject *text(Reader *r, Py_ssize_t n) {
    if (n < 0 || n > r->end - r->pos) return NULL;
    PyObject *s = PyUnicode_DecodeUTF8((const char *)r->buf + r->pos, n, NULL);
    if (s == NULL) { PyErr_Clear(); return NULL; }
    r->pos += n;
    return s;
}

static PyObject *read_one_partition(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    Reader r = {view.buf, 0, view.len};
    PyObject *client_id = NULL, *txn_id = NULL, *topic = NULL, *out = NULL;
    int16_t api_key, version, n16, acks;
    int32_t correlation_id, timeout_ms, partition;
    if (int16(&r, &api_key) < 0 || api_key != 0 || int16(&r, &version) < 0 || version < FIRST_VERSION ||
        version > LAST_VERSION || int32(&r, &correlation_id) < 0 || int16(&r, &n16) < 0 || n16 < -1)
        goto none;
    int flexible = version >= FIRST_FLEXIBLE;
    /* the header's client id: a nullable int16 string, its bytes decoded leniently */
    if (n16 >= 0) {
        if (n16 > r.end - r.pos) goto none;
        client_id = PyUnicode_DecodeUTF8((const char *)r.buf + r.pos, n16, "replace");
        if (client_id == NULL) goto fail;
        r.pos += n16;
    } else {
        client_id = Py_NewRef(Py_None);
    }
    if (flexible && skip_tags(&r) < 0) goto none;
    Py_ssize_t header_size = r.pos;
    /* body: transactional id, acks, timeout, [topic [partition records]] */
    Py_ssize_t n = length(&r, flexible, 0);
    if (n == -1) {
        txn_id = Py_NewRef(Py_None);
    } else if ((txn_id = text(&r, n)) == NULL) {
        goto none;
    }
    if (int16(&r, &acks) < 0 || int32(&r, &timeout_ms) < 0) goto none;
    if (length(&r, flexible, 1) != 1) goto none;  /* one topic */
    if ((topic = text(&r, length(&r, flexible, 0))) == NULL) goto none;
    if (length(&r, flexible, 1) != 1) goto none;  /* one partition */
    if (int32(&r, &partition) < 0) goto none;
    Py_ssize_t size = length(&r, flexible, 1);
    if (size < 0 || size > r.end - r.pos) goto none;  /* null records: the general path's error */
    Py_ssize_t records_at = r.pos;
    r.pos += size;
    if (flexible && (skip_tags(&r) < 0 || skip_tags(&r) < 0 || skip_tags(&r) < 0)) goto none;
    out = Py_BuildValue("(iiOnOiiOinn)", (int)version, (int)correlation_id, client_id, header_size, txn_id,
                        (int)acks, (int)timeout_ms, topic, (int)partition, records_at, size);
    goto done;
none:
    out = Py_NewRef(Py_None);
    goto done;
fail:
    out = NULL;
done:
    Py_XDECREF(client_id);
    Py_XDECREF(txn_id);
    Py_XDECREF(topic);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"read_one_partition", read_one_partition, METH_O,
     "read_one_partition(frame): (version, correlation_id, client_id, header_size, transactional_id, acks, "
     "timeout_ms, topic, partition, records_offset, records_size) of a Produce v3-12 request frame with "
     "one topic and one partition, else None."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_produce",
                                    "The common produce request read in one compiled pass.", -1, methods};

PyMODINIT_FUNC PyInit__produce(void) { return PyModule_Create(&module); }
