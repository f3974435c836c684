// cpp-httplib as zest uses it. The packaged library (libcpp-httplib) is compiled with OpenSSL, zlib
// and Brotli support, which changes the layout of its classes; these macros must match it, so include
// httplib only through this header. Link with -lcpp-httplib (pkg-config cpp-httplib).
#pragma once

#ifndef CPPHTTPLIB_OPENSSL_SUPPORT
#define CPPHTTPLIB_OPENSSL_SUPPORT
#endif
#ifndef CPPHTTPLIB_ZLIB_SUPPORT
#define CPPHTTPLIB_ZLIB_SUPPORT
#endif
#ifndef CPPHTTPLIB_BROTLI_SUPPORT
#define CPPHTTPLIB_BROTLI_SUPPORT
#endif
#include <httplib.h>
