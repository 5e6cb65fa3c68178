/* The text form of a coalesced message's Kafka batches (batch_meta.encode_parts).
 *
 * Under many small producers a flush writes one message holding tens of Kafka batches, and
 * each BatchMeta is stored as a line of eleven to thirteen decimal integers. In Python the
 * formatting of those integers was the largest per-request cost left in the flush job; here
 * one call writes every line, holding the GIL (the metas are Python objects).
 *
 * encode_parts(metas) -> bytes
 *   metas: a list or tuple of BatchMeta. Each line is "1;" followed by the fields of
 *   batch_meta._FIELDS separated by ';', then ";producer_record_count" when it or
 *   delete_horizon_ms is not -1, then ";delete_horizon_ms" when that is not -1 (exactly
 *   BatchMeta.encode); lines are separated by '\n'.
 *
 * use_class(BatchMeta): read the fields of objects of exactly that class from their slots
 *   (the member descriptors' offsets) instead of looking each attribute up by name; other
 *   objects are read by name.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#define FIELD_COUNT 11
#define OPTIONAL_COUNT 2
/* "1" + 13 fields of at most 20 characters each with their ';' + '\n'. */
#define LINE_MAX_BYTES (1 + (FIELD_COUNT + OPTIONAL_COUNT) * 21 + 1)

static const char *field_names[FIELD_COUNT + OPTIONAL_COUNT] = {
    "base_offset", "last_offset_delta", "record_count", "base_timestamp", "max_timestamp",
    "producer_id", "producer_epoch", "base_sequence", "attributes", "partition_leader_epoch",
    "schema_id", "producer_record_count", "delete_horizon_ms",
};
static PyObject *field_keys[FIELD_COUNT + OPTIONAL_COUNT];
static PyTypeObject *slotted_type = NULL; /* a strong reference, set by use_class */
static Py_ssize_t slot_offsets[FIELD_COUNT + OPTIONAL_COUNT];

static PyObject *use_class(PyObject *self, PyObject *cls) {
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "use_class takes a class");
        return NULL;
    }
    Py_ssize_t offsets[FIELD_COUNT + OPTIONAL_COUNT];
    for (int f = 0; f < FIELD_COUNT + OPTIONAL_COUNT; f++) {
        PyObject *descr = PyObject_GetAttr(cls, field_keys[f]);
        if (descr == NULL)
            return NULL;
        int is_member = Py_IS_TYPE(descr, &PyMemberDescr_Type);
        if (is_member) {
            PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
            is_member = member->type == T_OBJECT_EX;
            offsets[f] = member->offset;
        }
        Py_DECREF(descr);
        if (!is_member) {
            PyErr_Format(PyExc_TypeError, "%R.%U is not a slot", cls, field_keys[f]);
            return NULL;
        }
    }
    memcpy(slot_offsets, offsets, sizeof offsets);
    Py_INCREF(cls);
    Py_XSETREF(slotted_type, (PyTypeObject *)cls);
    Py_RETURN_NONE;
}

/* The value of field f of obj as a new reference (NULL with an exception when unset). */
static PyObject *get_field(PyObject *obj, int f) {
    if (slotted_type != NULL && Py_IS_TYPE(obj, slotted_type)) {
        PyObject *value = *(PyObject **)((char *)obj + slot_offsets[f]);
        if (value == NULL) {
            PyErr_SetObject(PyExc_AttributeError, field_keys[f]);
            return NULL;
        }
        Py_INCREF(value);
        return value;
    }
    return PyObject_GetAttr(obj, field_keys[f]);
}

/* Writes ';' and the decimal form of v at out; returns the bytes written. */
static Py_ssize_t put_field(char *out, long long v) {
    char digits[24];
    int n = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        digits[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    Py_ssize_t w = 0;
    out[w++] = ';';
    if (v < 0)
        out[w++] = '-';
    while (n)
        out[w++] = digits[--n];
    return w;
}

static PyObject *encode_parts(PyObject *self, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "encode_parts takes a list or tuple of BatchMeta");
    if (seq == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t capacity = count * LINE_MAX_BYTES;
    char *buffer = PyMem_Malloc(capacity > 0 ? (size_t)capacity : 1);
    if (buffer == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    Py_ssize_t w = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        long long values[FIELD_COUNT + OPTIONAL_COUNT];
        for (int f = 0; f < FIELD_COUNT + OPTIONAL_COUNT; f++) {
            PyObject *value = get_field(items[i], f);
            if (value == NULL)
                goto fail;
            values[f] = PyLong_AsLongLong(value);
            Py_DECREF(value);
            if (values[f] == -1 && PyErr_Occurred())
                goto fail;
        }
        if (i)
            buffer[w++] = '\n';
        buffer[w++] = '1';
        for (int f = 0; f < FIELD_COUNT; f++)
            w += put_field(buffer + w, values[f]);
        long long record_count = values[FIELD_COUNT], horizon = values[FIELD_COUNT + 1];
        if (record_count != -1 || horizon != -1)
            w += put_field(buffer + w, record_count);
        if (horizon != -1)
            w += put_field(buffer + w, horizon);
    }
    Py_DECREF(seq);
    PyObject *out = PyBytes_FromStringAndSize(buffer, w);
    PyMem_Free(buffer);
    return out;
fail:
    Py_DECREF(seq);
    PyMem_Free(buffer);
    return NULL;
}

static PyMethodDef methods[] = {
    {"encode_parts", encode_parts, METH_O, "The text form of a coalesced message's BatchMetas, one a line."},
    {"use_class", use_class, METH_O, "Read the fields of objects of this class from their slots."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_meta_text", "BatchMeta text encoding of coalesced messages.", -1, methods,
};

PyMODINIT_FUNC PyInit__meta_text(void) {
    for (int f = 0; f < FIELD_COUNT + OPTIONAL_COUNT; f++) {
        field_keys[f] = PyUnicode_InternFromString(field_names[f]);
        if (field_keys[f] == NULL)
            return NULL;
    }
    return PyModule_Create(&module);
}
