/* KVO_API marks what libkvoffload exports: the kvo_ functions of the C ABI and the C++ API of
 * include/kvoffload/. The library is built with hidden visibility, so everything else stays
 * inside it. C and C++. */
#ifndef KVOFFLOAD_API_H_
#define KVOFFLOAD_API_H_

#if defined(__GNUC__) || defined(__clang__)
#define KVO_API __attribute__((visibility("default")))
#else
#define KVO_API
#endif

#endif /* KVOFFLOAD_API_H_ */
