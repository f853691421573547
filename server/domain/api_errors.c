/* api_errors.c -- core and session codes as API errors (api_errors.h). */
#include "api_errors.h"

#include "nc_common.h"

api_error api_error_from_core(int rc)
{
    switch (rc) {
    case NC_OK: return API_OK;
    case NC_EINVAL: return API_OUT_OF_RANGE;
    case NC_EFORMAT: return API_INVALID_TEXT;
    case NC_ENOTFOUND: return API_NOT_FOUND;
    case NC_ESTATE: return API_CONFLICT;
    case NC_ENOSPACE: return API_STORAGE_FULL;
    /* in a request, only durable storage (the log, a snapshot) does I/O */
    case NC_EIO: return API_STORAGE_UNAVAILABLE;
    default: return API_INTERNAL;
    }
}

api_error api_error_from_storage(int rc, api_error otherwise)
{
    return rc == NC_EIO || rc == NC_ENOSPACE ? api_error_from_core(rc) : otherwise;
}

api_error api_error_from_namespace(int rc)
{
    switch (rc) {
    case NC_EINVAL: return API_OUT_OF_RANGE;
    case NC_ENOTFOUND: return API_NOT_FOUND;
    case NC_ESTATE: return API_NOT_READY;
    default: return api_error_from_storage(rc, API_INTERNAL);
    }
}

api_error api_error_from_sessions(sessions_rc rc)
{
    static const api_error map[] = {
        [SESS_OK] = API_OK, [SESS_ENOTFOUND] = API_SESSION_NOT_FOUND, [SESS_EEXIST] = API_CONFLICT,
        [SESS_ELIMIT] = API_TOO_MANY_SESSIONS, [SESS_EMEMORY] = API_MEMORY_BUDGET,
        [SESS_EINVAL] = API_OUT_OF_RANGE, [SESS_ENOMEM] = API_INTERNAL,
        [SESS_ESTORAGE] = API_STORAGE_UNAVAILABLE, [SESS_ENOSPACE] = API_STORAGE_FULL};
    return (unsigned)rc < sizeof map / sizeof map[0] ? map[rc] : API_INTERNAL;
}
