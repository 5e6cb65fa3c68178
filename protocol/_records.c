/* Compiled scanner and writer for the records section of a Kafka record batch v2.
 *
 * decode_records() turns the (decompressed) records section into flat column
 * buffers that Python wraps as Arrow arrays without creating a Python object per
 * record; encode_records() writes the section back from Arrow buffers.  Input is
 * untrusted: every read is bounds-checked against the record's declared length and
 * every length against what is left, and sizes are checked before they are added.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *CorruptRecordError;
static PyObject *InvalidRecordError;

/* ---------------------------------------------------------------- varints */

static inline int
read_varint(const uint8_t **pp, const uint8_t *end, int32_t *out)
{
    const uint8_t *p = *pp;
    uint32_t raw = 0;
    int i;
    if (p < end && !(*p & 0x80)) {            /* one-byte fast path */
        raw = *p++;
        *pp = p;
        *out = (int32_t)((raw >> 1) ^ (0u - (raw & 1u)));
        return 0;
    }
    for (i = 0; i < 5; i++) {
        uint8_t b;
        if (p >= end)
            return -1;
        b = *p++;
        /* The fifth byte holds the last 4 bits; more would overflow 32 bits. */
        if (i == 4 && (b & 0xF0))
            return -1;
        raw |= (uint32_t)(b & 0x7F) << (7 * i);
        if (!(b & 0x80)) {
            *pp = p;
            *out = (int32_t)((raw >> 1) ^ (0u - (raw & 1u)));
            return 0;
        }
    }
    return -1;
}

static inline int
read_varlong(const uint8_t **pp, const uint8_t *end, int64_t *out)
{
    const uint8_t *p = *pp;
    uint64_t raw = 0;
    int i;
    for (i = 0; i < 10; i++) {
        uint8_t b;
        if (p >= end)
            return -1;
        b = *p++;
        if (i == 9 && (b & 0xFE))
            return -1;
        raw |= (uint64_t)(b & 0x7F) << (7 * i);
        if (!(b & 0x80)) {
            *pp = p;
            *out = (int64_t)((raw >> 1) ^ (0ull - (raw & 1ull)));
            return 0;
        }
    }
    return -1;
}

static inline uint64_t
zigzag64(int64_t v)
{
    return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
}

static inline int
varint_size(int64_t v)
{
    uint64_t raw = zigzag64(v);
    int n = 1;
    while (raw >= 0x80) {
        raw >>= 7;
        n++;
    }
    return n;
}

static inline uint8_t *
write_varint(uint8_t *p, int64_t v)
{
    uint64_t raw = zigzag64(v);
    while (raw >= 0x80) {
        *p++ = (uint8_t)(raw | 0x80);
        raw >>= 7;
    }
    *p++ = (uint8_t)raw;
    return p;
}

/* Well-formed UTF-8 as Unicode defines it (no overlongs, surrogates or > U+10FFFF),
 * the same set Python's strict decoder accepts; Arrow string columns require it. */
static int
valid_utf8(const uint8_t *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) {
            if (n - i < 2 || (s[i + 1] & 0xC0) != 0x80)
                return 0;
            i += 2;
        }
        else if (c >= 0xE0 && c <= 0xEF) {
            uint8_t lo = 0x80, hi = 0xBF;
            if (c == 0xE0)
                lo = 0xA0;
            else if (c == 0xED)
                hi = 0x9F;
            if (n - i < 3 || s[i + 1] < lo || s[i + 1] > hi || (s[i + 2] & 0xC0) != 0x80)
                return 0;
            i += 3;
        }
        else if (c >= 0xF0 && c <= 0xF4) {
            uint8_t lo = 0x80, hi = 0xBF;
            if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;
            if (n - i < 4 || s[i + 1] < lo || s[i + 1] > hi || (s[i + 2] & 0xC0) != 0x80 ||
                (s[i + 3] & 0xC0) != 0x80)
                return 0;
            i += 4;
        }
        else
            return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- decode */

typedef struct {
    const char *msg;
    Py_ssize_t record;
    int invalid;          /* well-formed but refused: InvalidRecordError */
} scan_error;

typedef struct {
    Py_ssize_t key_bytes, value_bytes, headers, hkey_bytes, hvalue_bytes;
    Py_ssize_t key_nulls, value_nulls, hvalue_nulls;
} scan_totals;

/* What a produced batch is checked against, gathered by the measuring pass when asked:
 * the first and largest timestamp delta, and whether the offset deltas are 0..n-1. */
typedef struct {
    int64_t first_ts, max_ts;
    int dense;
} scan_stats;

/* Destinations of the fill pass; capacities guard against a buffer that changed
 * between the two passes (a bytearray mutated by another thread). */
typedef struct {
    int64_t *ts;
    int32_t *off;
    int32_t *key_off, *val_off, *hdr_off, *hkey_off, *hval_off;
    uint8_t *key_data, *val_data, *hkey_data, *hval_data;
    uint8_t *key_valid, *val_valid, *hval_valid;
    scan_totals cap;
} scan_out;

#define FAIL(m)                                                                   \
    do {                                                                          \
        err->msg = (m);                                                           \
        err->record = i;                                                          \
        return -1;                                                                \
    } while (0)

/* One pass over the records.  With out == NULL it validates and measures; with out
 * set it copies into the buffers sized from the measuring pass. */
static int
scan_records(const uint8_t *p, const uint8_t *end, Py_ssize_t count, scan_totals *t,
             scan_out *out, scan_error *err, scan_stats *stats)
{
    Py_ssize_t i = 0, kpos = 0, vpos = 0, hpos = 0, hkpos = 0, hvpos = 0;
    Py_ssize_t knull = 0, vnull = 0, hvnull = 0;

    if (out) {
        out->key_off[0] = out->val_off[0] = out->hdr_off[0] = out->hkey_off[0] =
            out->hval_off[0] = 0;
    }
    for (i = 0; i < count; i++) {
        int32_t len, od, kl, vl, hc, j;
        int64_t ts;
        const uint8_t *rend;

        if (read_varint(&p, end, &len))
            FAIL("bad record length varint");
        /* attributes, timestamp, offset, key, value, header count: >= 6 bytes */
        if (len < 6 || len > end - p)
            FAIL("record length out of bounds");
        rend = p + len;
        p++; /* record attributes: unused by Kafka */
        if (read_varlong(&p, rend, &ts))
            FAIL("bad timestamp delta varlong");
        if (read_varint(&p, rend, &od))
            FAIL("bad offset delta varint");
        if (read_varint(&p, rend, &kl))
            FAIL("bad key length varint");
        if (kl < -1 || kl > rend - p)
            FAIL("key length out of bounds");
        if (out) {
            out->ts[i] = ts;
            out->off[i] = od;
        }
        if (stats) {
            if (i == 0)
                stats->first_ts = stats->max_ts = ts;
            else if (ts > stats->max_ts)
                stats->max_ts = ts;
            if (od != i)
                stats->dense = 0;
        }
        if (kl >= 0) {
            if (out) {
                if (kl > out->cap.key_bytes - kpos)
                    FAIL("records changed while decoding");
                memcpy(out->key_data + kpos, p, (size_t)kl);
                if (out->key_valid)
                    out->key_valid[i >> 3] |= (uint8_t)(1u << (i & 7));
            }
            kpos += kl;
            p += kl;
        }
        else
            knull++;
        if (read_varint(&p, rend, &vl))
            FAIL("bad value length varint");
        if (vl < -1 || vl > rend - p)
            FAIL("value length out of bounds");
        if (vl >= 0) {
            if (out) {
                if (vl > out->cap.value_bytes - vpos)
                    FAIL("records changed while decoding");
                memcpy(out->val_data + vpos, p, (size_t)vl);
                if (out->val_valid)
                    out->val_valid[i >> 3] |= (uint8_t)(1u << (i & 7));
            }
            vpos += vl;
            p += vl;
        }
        else
            vnull++;
        if (read_varint(&p, rend, &hc))
            FAIL("bad header count varint");
        /* each header takes at least two bytes (key length and value length) */
        if (hc < 0 || hc > (rend - p) / 2)
            FAIL("header count out of bounds");
        for (j = 0; j < hc; j++) {
            int32_t hkl, hvl;
            if (read_varint(&p, rend, &hkl))
                FAIL("bad header key length varint");
            if (hkl < 0 || hkl > rend - p)
                FAIL(hkl == -1 ? "null header key" : "header key length out of bounds");
            if (!valid_utf8(p, hkl)) {
                err->invalid = 1;
                FAIL("header key is not valid UTF-8");
            }
            if (out) {
                if (hpos >= out->cap.headers || hkl > out->cap.hkey_bytes - hkpos)
                    FAIL("records changed while decoding");
                memcpy(out->hkey_data + hkpos, p, (size_t)hkl);
                out->hkey_off[hpos + 1] = (int32_t)(hkpos + hkl);
            }
            hkpos += hkl;
            p += hkl;
            if (read_varint(&p, rend, &hvl))
                FAIL("bad header value length varint");
            if (hvl < -1 || hvl > rend - p)
                FAIL("header value length out of bounds");
            if (hvl >= 0) {
                if (out) {
                    if (hvl > out->cap.hvalue_bytes - hvpos)
                        FAIL("records changed while decoding");
                    memcpy(out->hval_data + hvpos, p, (size_t)hvl);
                    if (out->hval_valid)
                        out->hval_valid[hpos >> 3] |= (uint8_t)(1u << (hpos & 7));
                }
                hvpos += hvl;
                p += hvl;
            }
            else
                hvnull++;
            if (out)
                out->hval_off[hpos + 1] = (int32_t)hvpos;
            hpos++;
        }
        if (p != rend)
            FAIL("record length does not match its fields");
        if (out) {
            out->key_off[i + 1] = (int32_t)kpos;
            out->val_off[i + 1] = (int32_t)vpos;
            out->hdr_off[i + 1] = (int32_t)hpos;
        }
    }
    if (p != end)
        FAIL("bytes left after the declared number of records");
    if (out && (kpos != out->cap.key_bytes || vpos != out->cap.value_bytes ||
                hpos != out->cap.headers || hkpos != out->cap.hkey_bytes ||
                hvpos != out->cap.hvalue_bytes || knull != out->cap.key_nulls ||
                vnull != out->cap.value_nulls || hvnull != out->cap.hvalue_nulls))
        FAIL("records changed while decoding");
    t->key_bytes = kpos;
    t->value_bytes = vpos;
    t->headers = hpos;
    t->hkey_bytes = hkpos;
    t->hvalue_bytes = hvpos;
    t->key_nulls = knull;
    t->value_nulls = vnull;
    t->hvalue_nulls = hvnull;
    return 0;
}

#undef FAIL

static PyObject *
new_bytes(Py_ssize_t size, uint8_t **data, int zero)
{
    PyObject *b = PyBytes_FromStringAndSize(NULL, size);
    if (b == NULL)
        return NULL;
    *data = (uint8_t *)PyBytes_AS_STRING(b);
    if (zero)
        memset(*data, 0, (size_t)size);
    return b;
}

static PyObject *
raise_scan_error(const scan_error *err)
{
    PyErr_Format(err->invalid ? InvalidRecordError : CorruptRecordError, "record %zd: %s",
                 err->record, err->msg);
    return NULL;
}

#define N_OUT 14

PyDoc_STRVAR(decode_doc,
"decode_records(records, count) -> tuple\n\n"
"Scan an uncompressed records section holding `count` records. Returns\n"
"(timestamp_delta int64, offset_delta int32,\n"
" key_offsets, key_data, key_validity|None, key_nulls,\n"
" value_offsets, value_data, value_validity|None, value_nulls,\n"
" header_offsets, header_key_offsets, header_key_data,\n"
" header_value_offsets, header_value_data, header_value_validity|None, header_value_nulls)\n"
"as bytes (offsets int32, validity as Arrow bitmaps).");

static PyObject *
decode_records(PyObject *self, PyObject *args)
{
    Py_buffer in;
    Py_ssize_t count;
    scan_totals t;
    scan_out o;
    scan_error err = {NULL, 0, 0};
    PyObject *objs[N_OUT] = {NULL};
    PyObject *result = NULL;
    int rc, k;
    const uint8_t *start, *end;

    if (!PyArg_ParseTuple(args, "y*n:decode_records", &in, &count))
        return NULL;
    start = (const uint8_t *)in.buf;
    end = start + in.len;
    /* The smallest record is 7 bytes: refusing a larger count up front keeps a
     * hostile count from sizing the allocations. */
    if (count < 0 || count > in.len / 7) {
        PyErr_Format(CorruptRecordError,
                     "record count %zd does not fit in %zd bytes of records", count, in.len);
        goto done;
    }
    memset(&t, 0, sizeof t);
    Py_BEGIN_ALLOW_THREADS
    rc = scan_records(start, end, count, &t, NULL, &err, NULL);
    Py_END_ALLOW_THREADS
    if (rc) {
        raise_scan_error(&err);
        goto done;
    }

    memset(&o, 0, sizeof o);
    o.cap = t;
    if (!(objs[0] = new_bytes(count * 8, (uint8_t **)&o.ts, 0)) ||
        !(objs[1] = new_bytes(count * 4, (uint8_t **)&o.off, 0)) ||
        !(objs[2] = new_bytes((count + 1) * 4, (uint8_t **)&o.key_off, 0)) ||
        !(objs[3] = new_bytes(t.key_bytes, &o.key_data, 0)) ||
        (t.key_nulls && !(objs[4] = new_bytes((count + 7) / 8, &o.key_valid, 1))) ||
        !(objs[5] = new_bytes((count + 1) * 4, (uint8_t **)&o.val_off, 0)) ||
        !(objs[6] = new_bytes(t.value_bytes, &o.val_data, 0)) ||
        (t.value_nulls && !(objs[7] = new_bytes((count + 7) / 8, &o.val_valid, 1))) ||
        !(objs[8] = new_bytes((count + 1) * 4, (uint8_t **)&o.hdr_off, 0)) ||
        !(objs[9] = new_bytes((t.headers + 1) * 4, (uint8_t **)&o.hkey_off, 0)) ||
        !(objs[10] = new_bytes(t.hkey_bytes, &o.hkey_data, 0)) ||
        !(objs[11] = new_bytes((t.headers + 1) * 4, (uint8_t **)&o.hval_off, 0)) ||
        !(objs[12] = new_bytes(t.hvalue_bytes, &o.hval_data, 0)) ||
        (t.hvalue_nulls && !(objs[13] = new_bytes((t.headers + 7) / 8, &o.hval_valid, 1))))
        goto done;

    Py_BEGIN_ALLOW_THREADS
    rc = scan_records(start, end, count, &t, &o, &err, NULL);
    Py_END_ALLOW_THREADS
    if (rc) {
        raise_scan_error(&err);
        goto done;
    }
#define OBJ(k) (objs[k] ? objs[k] : Py_None)
    result = Py_BuildValue("(OOOOOnOOOnOOOOOOn)", OBJ(0), OBJ(1), OBJ(2), OBJ(3), OBJ(4),
                           t.key_nulls, OBJ(5), OBJ(6), OBJ(7), t.value_nulls, OBJ(8),
                           OBJ(9), OBJ(10), OBJ(11), OBJ(12), OBJ(13), t.hvalue_nulls);
#undef OBJ
done:
    for (k = 0; k < N_OUT; k++)
        Py_XDECREF(objs[k]);
    PyBuffer_Release(&in);
    return result;
}

PyDoc_STRVAR(check_doc,
"check_records(records, count) -> (first_timestamp_delta, max_timestamp_delta, dense)\n\n"
"Validate an uncompressed records section holding `count` (>= 1) records exactly as\n"
"decode_records does (same errors), without copying anything out: the first and the\n"
"largest timestamp delta, and whether the offset deltas are 0..count-1.");

/* Sections up to this size are checked holding the GIL: handing it over costs more. */
#define CHECK_GIL_FREE_BYTES (64 * 1024)

static PyObject *
check_records(PyObject *self, PyObject *args)
{
    Py_buffer in;
    Py_ssize_t count;
    scan_totals t;
    scan_stats st = {0, 0, 1};
    scan_error err = {NULL, 0, 0};
    PyObject *result = NULL;
    int rc;
    const uint8_t *start, *end;

    if (!PyArg_ParseTuple(args, "y*n:check_records", &in, &count))
        return NULL;
    start = (const uint8_t *)in.buf;
    end = start + in.len;
    if (count < 1 || count > in.len / 7) {
        PyErr_Format(CorruptRecordError,
                     "record count %zd does not fit in %zd bytes of records", count, in.len);
        goto done;
    }
    memset(&t, 0, sizeof t);
    if (in.len > CHECK_GIL_FREE_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        rc = scan_records(start, end, count, &t, NULL, &err, &st);
        Py_END_ALLOW_THREADS
    }
    else
        rc = scan_records(start, end, count, &t, NULL, &err, &st);
    if (rc) {
        raise_scan_error(&err);
        goto done;
    }
    result = Py_BuildValue("(LLO)", (long long)st.first_ts, (long long)st.max_ts,
                           st.dense ? Py_True : Py_False);
done:
    PyBuffer_Release(&in);
    return result;
}

/* ---------------------------------------------------------------- snappy */

PyDoc_STRVAR(snappy_doc,
"snappy_uncompress(block, max_size) -> bytes | None\n\n"
"Decompress one raw snappy block holding the GIL (for small blocks: handing the GIL\n"
"over to a library that releases it costs more than the work). None when the block\n"
"declares more than `max_size` bytes; CorruptRecordError when it is malformed.");

/* One raw snappy block: new bytes, None (more than max_size declared), or NULL with
 * CorruptRecordError set. */
static PyObject *
snappy_block(const uint8_t *p, Py_ssize_t n, Py_ssize_t max_size)
{
    PyObject *result = NULL;
    const uint8_t *end = p + n;
    uint8_t *out, *o, *oend;
    uint64_t declared = 0;
    int shift = 0;
    const char *bad = NULL;

    for (;;) {
        if (p >= end || shift > 28) {
            bad = "bad snappy length preamble";
            goto done;
        }
        declared |= (uint64_t)(*p & 0x7F) << shift;
        if (!(*p++ & 0x80))
            break;
        shift += 7;
    }
    if (declared > 0xFFFFFFFFu) {
        bad = "bad snappy length preamble";
        goto done;
    }
    if ((Py_ssize_t)declared > max_size) {
        Py_INCREF(Py_None);
        result = Py_None;
        goto done;
    }
    result = new_bytes((Py_ssize_t)declared, &out, 0);
    if (result == NULL)
        goto done;
    o = out;
    oend = out + declared;
    while (p < end) {
        uint8_t tag = *p++;
        size_t len, off;
        switch (tag & 3) {
        case 0:
            len = tag >> 2;
            if (len >= 60) {
                size_t n = len - 59, k;
                if ((size_t)(end - p) < n) {
                    bad = "snappy literal length runs past the block";
                    goto done;
                }
                len = 0;
                for (k = 0; k < n; k++)
                    len |= (size_t)p[k] << (8 * k);
                p += n;
            }
            len += 1;
            if ((size_t)(end - p) < len || (size_t)(oend - o) < len) {
                bad = "snappy literal runs past the block or the declared length";
                goto done;
            }
            memcpy(o, p, len);
            o += len;
            p += len;
            continue;
        case 1:
            if (end - p < 1) {
                bad = "snappy copy runs past the block";
                goto done;
            }
            len = ((tag >> 2) & 7) + 4;
            off = ((size_t)(tag >> 5) << 8) | p[0];
            p += 1;
            break;
        case 2:
            if (end - p < 2) {
                bad = "snappy copy runs past the block";
                goto done;
            }
            len = (tag >> 2) + 1;
            off = (size_t)p[0] | ((size_t)p[1] << 8);
            p += 2;
            break;
        default:
            if (end - p < 4) {
                bad = "snappy copy runs past the block";
                goto done;
            }
            len = (tag >> 2) + 1;
            off = (size_t)p[0] | ((size_t)p[1] << 8) | ((size_t)p[2] << 16) | ((size_t)p[3] << 24);
            p += 4;
            break;
        }
        if (off == 0 || off > (size_t)(o - out) || (size_t)(oend - o) < len) {
            bad = "snappy copy outside the output";
            goto done;
        }
        {
            const uint8_t *src = o - off;
            size_t k;
            for (k = 0; k < len; k++) /* overlapping copies repeat a pattern */
                o[k] = src[k];
            o += len;
        }
    }
    if (o != oend)
        bad = "snappy block shorter than its declared length";
done:
    if (bad) {
        Py_CLEAR(result);
        PyErr_Format(CorruptRecordError, "cannot decompress snappy records: %s", bad);
    }
    return result;
}

static PyObject *
snappy_uncompress(PyObject *self, PyObject *args)
{
    Py_buffer in;
    Py_ssize_t max_size;
    PyObject *result;

    if (!PyArg_ParseTuple(args, "y*n:snappy_uncompress", &in, &max_size))
        return NULL;
    result = snappy_block((const uint8_t *)in.buf, in.len, max_size);
    PyBuffer_Release(&in);
    return result;
}

/* ---------------------------------------------------------------- produced batch */

/* CRC-32C (Castagnoli, reflected 0x82F63B78): SSE 4.2's instruction where the CPU has
 * it, else a table. */
static uint32_t crc32c_table[256];
static int crc32c_hw_ok;

static void
crc32c_init(void)
{
    uint32_t i, k, c;
    for (i = 0; i < 256; i++) {
        c = i;
        for (k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        crc32c_table[i] = c;
    }
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    crc32c_hw_ok = __builtin_cpu_supports("sse4.2");
#endif
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("sse4.2"))) static uint32_t
crc32c_hw(uint32_t crc, const uint8_t *p, size_t n)
{
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
        p += 8;
        n -= 8;
    }
    crc = (uint32_t)c;
    while (n--)
        crc = __builtin_ia32_crc32qi(crc, *p++);
    return crc;
}
#endif

static uint32_t
crc32c(const uint8_t *p, size_t n)
{
    uint32_t crc = 0xFFFFFFFFu;
#if defined(__x86_64__) && defined(__GNUC__)
    if (crc32c_hw_ok)
        return crc32c_hw(crc, p, n) ^ 0xFFFFFFFFu;
#endif
    while (n--)
        crc = crc32c_table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return crc ^ 0xFFFFFFFFu;
}

static inline uint32_t
be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint64_t
be64(const uint8_t *p)
{
    return ((uint64_t)be32(p) << 32) | be32(p + 4);
}

#define BATCH_HEADER 61
#define BATCH_LENGTH_END 12
#define BATCH_CRC_START 21
#define XERIAL_MAGIC "\x82SNAPPY\0"
#define XERIAL_HEADER 16

PyDoc_STRVAR(produced_doc,
"check_produced(batch, max_decompressed) -> tuple | None\n\n"
"The usual small produced batch checked in one call: exactly one v2 batch filling\n"
"`batch`, its CRC-32C right, neither control nor transactional, uncompressed or one raw\n"
"snappy block, its records well-formed with offset deltas 0..n-1 (n >= 1).  Returns\n"
"(attributes, last_offset_delta, base_timestamp, max_timestamp, producer_id,\n"
"producer_epoch, base_sequence, records_count, partition_leader_epoch, section,\n"
"first_timestamp_delta, max_timestamp_delta), `section` the decompressed records\n"
"(None when uncompressed: the batch's bytes after its header).  None for anything else,\n"
"refused or not: the caller's step-by-step checks then give their answer.");

static PyObject *
check_produced(PyObject *self, PyObject *args)
{
    Py_buffer in;
    Py_ssize_t max_size;
    PyObject *section = NULL, *result = NULL;
    const uint8_t *b, *rec, *rend;
    int32_t batch_length, records_count, last_offset_delta;
    int16_t attributes;
    scan_totals t;
    scan_stats st = {0, 0, 1};
    scan_error err = {NULL, 0, 0};

    if (!PyArg_ParseTuple(args, "y*n:check_produced", &in, &max_size))
        return NULL;
    b = (const uint8_t *)in.buf;
    if (in.len < BATCH_HEADER || b[16] != 2)
        goto none;
    batch_length = (int32_t)be32(b + 8);
    if (batch_length < BATCH_HEADER - BATCH_LENGTH_END || BATCH_LENGTH_END + (Py_ssize_t)batch_length != in.len)
        goto none;
    records_count = (int32_t)be32(b + 57);
    last_offset_delta = (int32_t)be32(b + 23);
    attributes = (int16_t)((b[21] << 8) | b[22]);
    if (records_count < 1 || last_offset_delta != records_count - 1 || (attributes & 0x30))
        goto none;
    if (crc32c(b + BATCH_CRC_START, (size_t)(in.len - BATCH_CRC_START)) != be32(b + 17))
        goto none;
    rec = b + BATCH_HEADER;
    rend = b + in.len;
    switch (attributes & 0x07) {
    case 0:
        break;
    case 2:
        if (rend - rec >= XERIAL_HEADER && memcmp(rec, XERIAL_MAGIC, 8) == 0)
            goto none;  /* snappy-java's framing: the general decompression */
        section = snappy_block(rec, rend - rec, max_size);
        if (section == NULL) {
            PyErr_Clear();
            goto none;
        }
        if (section == Py_None)
            goto none;
        rec = (const uint8_t *)PyBytes_AS_STRING(section);
        rend = rec + PyBytes_GET_SIZE(section);
        break;
    default:
        goto none;
    }
    if (records_count > (rend - rec) / 7)
        goto none;
    memset(&t, 0, sizeof t);
    if (scan_records(rec, rend, records_count, &t, NULL, &err, &st) || !st.dense)
        goto none;
    result = Py_BuildValue("(iiLLLiiiiOLL)", (int)attributes, (int)last_offset_delta,
                           (long long)be64(b + 27), (long long)be64(b + 35), (long long)be64(b + 43),
                           (int)(int16_t)((b[51] << 8) | b[52]), (int)(int32_t)be32(b + 53),
                           (int)records_count, (int)(int32_t)be32(b + 12),
                           section ? section : Py_None, (long long)st.first_ts, (long long)st.max_ts);
    goto done;
none:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(section);
    PyBuffer_Release(&in);
    return result;
}

/* ---------------------------------------------------------------- encode */

/* A binary/string Arrow array seen through its buffers: element i of the logical
 * array is element (offset + i) of the buffers. */
typedef struct {
    Py_buffer valid, offs, data;
    Py_ssize_t offset, length;
    const int32_t *o;
    const uint8_t *bits, *bytes;
} binary_view;

static int
binary_view_check(binary_view *v, const char *what)
{
    Py_ssize_t last;
    v->o = (const int32_t *)v->offs.buf;
    v->bits = (const uint8_t *)v->valid.buf;
    v->bytes = (const uint8_t *)v->data.buf;
    if (v->offset < 0 || v->length < 0 || v->offset > PY_SSIZE_T_MAX / 8 - v->length - 1) {
        PyErr_Format(PyExc_ValueError, "%s: bad array offset or length", what);
        return -1;
    }
    last = v->offset + v->length;
    if (v->offs.buf == NULL || v->offs.len / 4 < last + 1) {
        PyErr_Format(PyExc_ValueError, "%s: offsets buffer too short", what);
        return -1;
    }
    if (v->bits && v->valid.len < (last + 7) / 8) {
        PyErr_Format(PyExc_ValueError, "%s: validity buffer too short", what);
        return -1;
    }
    return 0;
}

static inline int
binary_is_valid(const binary_view *v, Py_ssize_t i)
{
    Py_ssize_t k = v->offset + i;
    return v->bits == NULL || (v->bits[k >> 3] >> (k & 7)) & 1;
}

/* Length of element i, or -1 for null, -2 for offsets outside the data buffer. */
static inline int64_t
binary_len(const binary_view *v, Py_ssize_t i)
{
    int32_t a, b;
    if (!binary_is_valid(v, i))
        return -1;
    a = v->o[v->offset + i];
    b = v->o[v->offset + i + 1];
    if (a < 0 || b < a || b > v->data.len)
        return -2;
    return (int64_t)b - a;
}

static void
binary_view_release(binary_view *v)
{
    if (v->valid.obj || v->valid.buf)
        PyBuffer_Release(&v->valid);
    if (v->offs.obj || v->offs.buf)
        PyBuffer_Release(&v->offs);
    if (v->data.obj || v->data.buf)
        PyBuffer_Release(&v->data);
}

PyDoc_STRVAR(encode_doc,
"encode_records(count, timestamp_delta, offset_delta,\n"
"               key_validity, key_offsets, key_data, key_offset,\n"
"               value_validity, value_offsets, value_data, value_offset,\n"
"               header_counts, header_count_total,\n"
"               hkey_validity, hkey_offsets, hkey_data, hkey_offset,\n"
"               hvalue_validity, hvalue_offsets, hvalue_data, hvalue_offset) -> bytes\n\n"
"Write an uncompressed records section. Buffers are Arrow buffers (validity may be\n"
"None); *_offset is the array's slice offset. header_counts is int32 per record or\n"
"None when no record has headers.");

static PyObject *
encode_records(PyObject *self, PyObject *args)
{
    Py_ssize_t n, nh, i, j;
    Py_buffer ts = {0}, od = {0}, hc = {0};
    binary_view k = {0}, v = {0}, hk = {0}, hv = {0};
    PyObject *result = NULL;
    int32_t *body = NULL;
    const int64_t *tsd;
    const int32_t *odd, *hcd;
    int64_t total = 0;
    const char *bad = NULL;
    Py_ssize_t bad_at = 0;
    int bad_invalid = 0;

    if (!PyArg_ParseTuple(args, "ny*y*z*y*z*nz*y*z*nz*nz*z*z*nz*z*z*n:encode_records", &n, &ts,
                          &od, &k.valid, &k.offs, &k.data, &k.offset, &v.valid, &v.offs,
                          &v.data, &v.offset, &hc, &nh, &hk.valid, &hk.offs, &hk.data,
                          &hk.offset, &hv.valid, &hv.offs, &hv.data, &hv.offset))
        return NULL;
    k.length = v.length = n;
    hk.length = hv.length = nh;
    if (n < 0 || nh < 0 || n > PY_SSIZE_T_MAX / 8 || ts.len < n * 8 || od.len < n * 4) {
        PyErr_SetString(PyExc_ValueError, "timestamp/offset delta buffers too short");
        goto done;
    }
    if (binary_view_check(&k, "keys") || binary_view_check(&v, "values"))
        goto done;
    if (hc.buf == NULL) {
        if (nh != 0) {
            PyErr_SetString(PyExc_ValueError, "header values given without header counts");
            goto done;
        }
    }
    else {
        if (hc.len < n * 4) {
            PyErr_SetString(PyExc_ValueError, "header counts buffer too short");
            goto done;
        }
        if (binary_view_check(&hk, "header keys") || binary_view_check(&hv, "header values"))
            goto done;
    }
    tsd = (const int64_t *)ts.buf;
    odd = (const int32_t *)od.buf;
    hcd = (const int32_t *)hc.buf;
    if (n > 0 && !(body = PyMem_Malloc((size_t)n * sizeof(int32_t)))) {
        PyErr_NoMemory();
        goto done;
    }

    Py_BEGIN_ALLOW_THREADS
    /* Pass 1: the size of every record body, and the total. */
    {
        Py_ssize_t h = 0;
        for (i = 0; i < n && !bad; i++) {
            int64_t size = 1 + varint_size(tsd[i]) + varint_size(odd[i]);
            int64_t kl = binary_len(&k, i), vl = binary_len(&v, i);
            int32_t cnt = hcd ? hcd[i] : 0;
            if (kl == -2 || vl == -2) {
                bad = "key or value offsets outside their data buffer";
                break;
            }
            size += kl < 0 ? 1 : varint_size(kl) + kl;
            size += vl < 0 ? 1 : varint_size(vl) + vl;
            if (cnt < 0 || cnt > nh - h) {
                bad = "header counts do not match the headers given";
                break;
            }
            size += varint_size(cnt);
            for (j = 0; j < cnt; j++, h++) {
                int64_t hkl = binary_len(&hk, h), hvl = binary_len(&hv, h);
                if (hkl == -2 || hvl == -2) {
                    bad = "header offsets outside their data buffer";
                    break;
                }
                if (hkl == -1) {
                    bad = "null header key";
                    bad_invalid = 1;
                    break;
                }
                size += varint_size(hkl) + hkl;
                size += hvl < 0 ? 1 : varint_size(hvl) + hvl;
            }
            if (bad)
                break;
            if (size > INT32_MAX) {
                bad = "record larger than 2 GiB";
                break;
            }
            body[i] = (int32_t)size;
            total += varint_size(size) + size;
            if (total > INT32_MAX) {
                bad = "records section larger than 2 GiB";
                break;
            }
        }
        bad_at = i;
        if (!bad && h != nh)
            bad = "header counts do not match the headers given";
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        PyErr_Format(bad_invalid ? InvalidRecordError : PyExc_ValueError, "record %zd: %s",
                     bad_at, bad);
        goto done;
    }

    {
        uint8_t *p, *base;
        result = new_bytes((Py_ssize_t)total, &base, 0);
        if (result == NULL)
            goto done;
        p = base;
        Py_BEGIN_ALLOW_THREADS
        /* Pass 2: write; every length was validated by pass 1. */
        {
            Py_ssize_t h = 0;
            for (i = 0; i < n; i++) {
                int64_t kl = binary_len(&k, i), vl = binary_len(&v, i);
                int32_t cnt = hcd ? hcd[i] : 0;
                p = write_varint(p, body[i]);
                *p++ = 0;
                p = write_varint(p, tsd[i]);
                p = write_varint(p, odd[i]);
                if (kl < 0)
                    *p++ = 1; /* zig-zag -1: null */
                else {
                    p = write_varint(p, kl);
                    if (kl > 0)
                        memcpy(p, k.bytes + k.o[k.offset + i], (size_t)kl);
                    p += kl;
                }
                if (vl < 0)
                    *p++ = 1;
                else {
                    p = write_varint(p, vl);
                    if (vl > 0)
                        memcpy(p, v.bytes + v.o[v.offset + i], (size_t)vl);
                    p += vl;
                }
                p = write_varint(p, cnt);
                for (j = 0; j < cnt; j++, h++) {
                    int64_t hkl = binary_len(&hk, h), hvl = binary_len(&hv, h);
                    p = write_varint(p, hkl);
                    if (hkl > 0)
                        memcpy(p, hk.bytes + hk.o[hk.offset + h], (size_t)hkl);
                    p += hkl;
                    if (hvl < 0)
                        *p++ = 1;
                    else {
                        p = write_varint(p, hvl);
                        if (hvl > 0)
                            memcpy(p, hv.bytes + hv.o[hv.offset + h], (size_t)hvl);
                        p += hvl;
                    }
                }
            }
        }
        Py_END_ALLOW_THREADS
        if (p - base != total) {
            /* Only reachable if an input buffer changed under us. */
            Py_CLEAR(result);
            PyErr_SetString(PyExc_RuntimeError, "record buffers changed while encoding");
        }
    }
done:
    PyMem_Free(body);
    PyBuffer_Release(&ts);
    PyBuffer_Release(&od);
    if (hc.obj || hc.buf)
        PyBuffer_Release(&hc);
    binary_view_release(&k);
    binary_view_release(&v);
    binary_view_release(&hk);
    binary_view_release(&hv);
    return result;
}

static PyMethodDef methods[] = {
    {"decode_records", decode_records, METH_VARARGS, decode_doc},
    {"check_records", check_records, METH_VARARGS, check_doc},
    {"snappy_uncompress", snappy_uncompress, METH_VARARGS, snappy_doc},
    {"check_produced", check_produced, METH_VARARGS, produced_doc},
    {"encode_records", encode_records, METH_VARARGS, encode_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_records",
    "Compiled scanner and writer for Kafka record batch v2 records.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__records(void)
{
    PyObject *m, *errors = PyImport_ImportModule("fluvial.errors");
    if (errors == NULL)
        return NULL;
    CorruptRecordError = PyObject_GetAttrString(errors, "CorruptRecordError");
    InvalidRecordError = PyObject_GetAttrString(errors, "InvalidRecordError");
    Py_DECREF(errors);
    if (CorruptRecordError == NULL || InvalidRecordError == NULL)
        return NULL;
    crc32c_init();
    m = PyModule_Create(&module);
    return m;
}
