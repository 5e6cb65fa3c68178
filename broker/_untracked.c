/* Instances the garbage collector does not track.
 *
 * Every heap class's instances are tracked by the cyclic collector, even when they can only
 * ever hold integers and bytes and so can never be part of a reference cycle. The log keeps
 * such objects for every stored batch (BatchMeta, BatchHeader): under many small producers
 * they were most of what each collection walked, and the collections' pauses stalled the
 * event loop for tens of milliseconds.
 *
 * untracked_instances(cls): instances of cls made after the call (through its __new__,
 *   copy, pickle, dataclasses.replace: everything allocates through tp_alloc) are created
 *   untracked. Refused for a class whose instances have a __dict__ or weak references, or
 *   whose allocator is not the generic one. The caller promises that the instances hold
 *   only objects that cannot refer back to them (numbers, bytes, strings, tuples of those,
 *   other untracked instances); a cycle through one would never be collected, only leaked.
 *
 * untracked_tuple(t): see below.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *untracked_alloc(PyTypeObject *type, Py_ssize_t nitems) {
    PyObject *obj = PyType_GenericAlloc(type, nitems);
    if (obj != NULL)
        PyObject_GC_UnTrack(obj);
    return obj;
}

static PyObject *untracked_instances(PyObject *self, PyObject *cls) {
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "untracked_instances takes a class");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)cls;
    if (type->tp_dictoffset != 0 || type->tp_weaklistoffset != 0) {
        PyErr_Format(PyExc_TypeError, "%R instances have a __dict__ or weak references", cls);
        return NULL;
    }
    if (type->tp_alloc != PyType_GenericAlloc && type->tp_alloc != untracked_alloc) {
        PyErr_Format(PyExc_TypeError, "%R has its own allocator", cls);
        return NULL;
    }
    if (!PyType_HasFeature(type, Py_TPFLAGS_HAVE_GC)) /* never tracked anyway */
        Py_RETURN_NONE;
    type->tp_alloc = untracked_alloc;
    Py_RETURN_NONE;
}

/* untracked_tuple(t): t itself, untracked when it is an exact tuple whose items are all
 * untracked (or never tracked). The collector untracks a tuple of atoms by itself, but treats
 * any instance of a class as possibly tracked, so a tuple of untracked instances stays
 * tracked without this. */
static PyObject *untracked_tuple(PyObject *self, PyObject *t) {
    if (PyTuple_CheckExact(t) && PyObject_GC_IsTracked(t)) {
        Py_ssize_t n = PyTuple_GET_SIZE(t);
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = PyTuple_GET_ITEM(t, i);
            if (item == NULL || PyObject_GC_IsTracked(item))
                goto done;
        }
        PyObject_GC_UnTrack(t);
    }
done:
    Py_INCREF(t);
    return t;
}

static PyMethodDef methods[] = {
    {"untracked_tuple", untracked_tuple, METH_O,
     "The tuple, untracked by the garbage collector when none of its items is tracked."},
    {"untracked_instances", untracked_instances, METH_O,
     "Create this class's later instances untracked by the cyclic garbage collector."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_untracked", "Instances the garbage collector does not track.", -1, methods,
};

PyMODINIT_FUNC PyInit__untracked(void) { return PyModule_Create(&module); }
