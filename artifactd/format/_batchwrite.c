/* artifactd.format._batchwrite: create a batch of small, already read files in one GIL release.
 *
 * An optional accelerator of the extractor's writer threads (artifactd/format/unpack.py,
 * _Extractor._write_batch), which stays the reference: this module does what that loop does
 * for a file that goes well, and stops at the first file that does not, so that the Python
 * loop does that file again and raises its own error. It never raises for a file; it reports
 * how far it got.
 *
 * Why: in Python each small file costs four calls that drop and re-take the GIL (sha256, open,
 * write, close); with a reading thread parsing the tar stream and two writers on two cores, the
 * writers spend about half their time waiting for the GIL to come back. Here a whole batch
 * (at most 32 files or 1 MiB) is written with the GIL released once.
 *
 * write_batch(items, umask) -> int
 *   items: list of (path: str, data: bytes-like, mode: int, sha256: str | None,
 *   mtime: int | None), path absolute, its directory already made.
 *   For each item in order:
 *     1. if sha256 is given: the data's SHA-256 (OpenSSL's, the library hashlib uses),
 *        as lowercase hex, must equal it; otherwise stop here, nothing created;
 *     2. open(path, O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC, mode & 0777), then fchmod to
 *        that mode if the umask took any of its bits;
 *     3. write all of data (short writes continued, EINTR retried);
 *     4. if mtime is given: set atime and mtime to it (whole seconds);
 *     5. close.
 *   A failure at steps 2-5 removes the file this call created and stops. Returns the number
 *   of items completed: the item at that index (if any) was not created, and the caller runs
 *   its own code from there. An item it cannot take (not the shape above, an embedded NUL, an
 *   out-of-range number, a buffer that is not contiguous) stops it the same way, before that
 *   item. Raises only OSError, when a file it created could not be removed again (and
 *   TypeError or MemoryError for the call itself).
 *
 * source_sha256: the sha256 of this file as setup.py built it (a stale build is caught by
 * tests/test_batchwrite.py: rebuild with `pip install -e .` after editing this file).
 *
 * SHA-256 comes from libcrypto, found by the first call that has a sha256 to check (dlopen;
 * the one hashlib loaded when there is one): no OpenSSL headers are needed to build this, and
 * a call that only writes (its caller checked the bytes: a small layer, hashed by CPython's
 * own SHA-256) loads no OpenSSL. Where there is none, an item with a sha256 is one this code
 * does not take: it stops before it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DIGEST_BYTES 32

typedef unsigned char *(*sha256_fn)(const unsigned char *data, size_t len, unsigned char *md);
static sha256_fn sha256_oneshot;

typedef struct {
    PyObject *path; /* bytes, the file-system encoding of the str */
    Py_buffer data;
    int has_data;
    mode_t mode;
    const char *sha256; /* the sha256 to check (its UTF-8), or NULL: none to check */
    int sha256_malformed; /* not 64 characters: no digest matches it */
    int has_mtime;
    long long mtime;
} item_t;

static int parse_item(PyObject *tuple, item_t *it) {
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != 5) {
        PyErr_SetString(PyExc_TypeError, "an item is (path, data, mode, sha256, mtime)");
        return -1;
    }
    PyObject *path = PyTuple_GET_ITEM(tuple, 0), *mode = PyTuple_GET_ITEM(tuple, 2);
    PyObject *sha = PyTuple_GET_ITEM(tuple, 3), *mtime = PyTuple_GET_ITEM(tuple, 4);
    if (!PyUnicode_Check(path) || !PyLong_Check(mode)) {
        PyErr_SetString(PyExc_TypeError, "path: str; mode: int");
        return -1;
    }
    it->path = PyUnicode_EncodeFSDefault(path);
    if (it->path == NULL) return -1;
    if ((Py_ssize_t)strlen(PyBytes_AS_STRING(it->path)) != PyBytes_GET_SIZE(it->path)) {
        PyErr_SetString(PyExc_ValueError, "path: embedded NUL");
        return -1;
    }
    long m = PyLong_AsLong(mode);
    if (m == -1 && PyErr_Occurred()) return -1;
    it->mode = (mode_t)(m & 0777);
    if (sha != Py_None) {
        Py_ssize_t n = 0;
        if (!PyUnicode_Check(sha)) {
            PyErr_SetString(PyExc_TypeError, "sha256: str or None");
            return -1;
        }
        it->sha256 = PyUnicode_AsUTF8AndSize(sha, &n);
        if (it->sha256 == NULL) return -1;
        it->sha256_malformed = n != 2 * DIGEST_BYTES; /* the Python loop then says so */
    }
    if (mtime != Py_None) {
        if (!PyLong_Check(mtime)) {
            PyErr_SetString(PyExc_TypeError, "mtime: int or None");
            return -1;
        }
        it->mtime = PyLong_AsLongLong(mtime);
        if (it->mtime == -1 && PyErr_Occurred()) return -1;
        it->has_mtime = 1;
    }
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(tuple, 1), &it->data, PyBUF_SIMPLE) < 0) return -1;
    it->has_data = 1;
    return 0;
}

static int digest_matches(const item_t *it) {
    static const char hex[] = "0123456789abcdef";
    unsigned char md[DIGEST_BYTES];
    if (it->sha256_malformed) return 0; /* and never read past its end */
    if (sha256_oneshot((const unsigned char *)it->data.buf, (size_t)it->data.len, md) == NULL)
        return 0;
    for (int i = 0; i < DIGEST_BYTES; i++) {
        if (it->sha256[2 * i] != hex[md[i] >> 4] || it->sha256[2 * i + 1] != hex[md[i] & 15])
            return 0;
    }
    return 1;
}

/* Create one file; 0 when done, else -1 with the file removed (or *unlink_errno set). */
static int write_one(const item_t *it, int umask_bits, int *unlink_errno) {
    const char *path = PyBytes_AS_STRING(it->path);
    if (it->sha256 != NULL && !digest_matches(it)) return -1;
    int fd;
    do {
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, it->mode);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return -1; /* nothing created: O_EXCL */
    int ok = !(umask_bits & it->mode) || fchmod(fd, it->mode) == 0;
    const char *data = (const char *)it->data.buf;
    Py_ssize_t left = it->data.len;
    while (ok && left > 0) {
        ssize_t w = write(fd, data, (size_t)left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) ok = 0;
        else {
            data += w;
            left -= w;
        }
    }
    if (ok && it->has_mtime) {
        struct timespec times[2] = {{(time_t)it->mtime, 0}, {(time_t)it->mtime, 0}};
        ok = futimens(fd, times) == 0;
    }
    if (close(fd) != 0) ok = 0;
    if (ok) return 0;
    if (unlink(path) != 0) *unlink_errno = errno;
    return -1;
}

static int load_sha256(void);

static PyObject *write_batch(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *items;
    int umask_bits;
    if (!PyArg_ParseTuple(args, "O!i:write_batch", &PyList_Type, &items, &umask_bits)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items), parsed = 0, done = 0;
    item_t *its = PyMem_Calloc(n ? (size_t)n : 1, sizeof(item_t));
    PyObject *result = NULL;
    if (its == NULL) return PyErr_NoMemory();
    Py_ssize_t usable = n;
    for (; parsed < n; parsed++) {
        if (parse_item(PyList_GET_ITEM(items, parsed), &its[parsed]) < 0) {
            /* An item this code does not take (an embedded NUL, a huge number, a buffer that
             * is not contiguous): the ones before it are written, then the caller's code
             * meets it and says what is wrong with it. */
            PyErr_Clear();
            usable = parsed++; /* parsed++: release what this item holds too */
            break;
        }
    }
    if (sha256_oneshot == NULL) {
        Py_ssize_t first = 0; /* the first item with a sha256 to check */
        while (first < usable && its[first].sha256 == NULL) first++;
        if (first < usable && load_sha256() < 0) usable = first; /* no libcrypto: stop there */
    }
    int unlink_errno = 0;
    Py_BEGIN_ALLOW_THREADS
    while (done < usable && write_one(&its[done], umask_bits, &unlink_errno) == 0) done++;
    Py_END_ALLOW_THREADS
    if (unlink_errno != 0) {
        errno = unlink_errno;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, its[done].path);
    } else {
        result = PyLong_FromSsize_t(done);
    }
    for (Py_ssize_t i = 0; i < parsed; i++) {
        Py_XDECREF(its[i].path);
        if (its[i].has_data) PyBuffer_Release(&its[i].data);
    }
    PyMem_Free(its);
    return result;
}

/* Find SHA256 (once; with the GIL held). 0 when found. */
static int load_sha256(void) {
    /* The libcrypto already loaded (by hashlib) first, then any on the library path. */
    static const char *names[] = {"libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.so"};
    for (int flags = RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD;; flags &= ~RTLD_NOLOAD) {
        for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
            void *lib = dlopen(names[i], flags);
            if (lib == NULL) continue;
            sha256_oneshot = (sha256_fn)dlsym(lib, "SHA256");
            if (sha256_oneshot != NULL) return 0;
            dlclose(lib);
        }
        if (!(flags & RTLD_NOLOAD)) break;
    }
    return -1;
}

static PyMethodDef methods[] = {
    {"write_batch", write_batch, METH_VARARGS,
     "write_batch(items, umask) -> int: create files until the first that fails; "
     "return how many were created."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "artifactd.format._batchwrite",
    .m_doc = "Create a batch of small files with the GIL released once (see unpack.py).",
    .m_size = -1,
    .m_methods = methods,
};

#ifndef SOURCE_SHA256
#define SOURCE_SHA256 "unknown" /* setup.py defines it: the sha256 of this file */
#endif

PyMODINIT_FUNC PyInit__batchwrite(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "source_sha256", SOURCE_SHA256) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
