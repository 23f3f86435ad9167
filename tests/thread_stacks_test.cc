// common/thread_stacks: a thread asking for a stack smaller than the
// process's static TLS still starts, and gets the stack it asked for.
#include "common/thread_stacks.h"

#include <errno.h>
#include <pthread.h>

#include <cstring>

#include "gtest/gtest.h"

namespace monsoon::common {
namespace {

// 256 KiB of static TLS in this test binary: more than the stack the test
// threads ask for, as OpenBLAS's and the CUDA libraries' TLS is more than
// civetweb's 100 KiB.
constexpr size_t kTlsBytes = 256 * 1024;
thread_local char big_tls[kTlsBytes];

void* TouchTls(void* arg) {
  std::memset(big_tls, 1, kTlsBytes);
  *static_cast<int*>(arg) = big_tls[kTlsBytes - 1];
  return nullptr;
}

TEST(ThreadStacksTest, CountsThisBinarysStaticTls) {
  // At least this file's; the libraries' come on top (a sanitizer's
  // runtime alone holds several hundred KiB).
  EXPECT_GE(StaticTlsBytes(), kTlsBytes);
}

TEST(ThreadStacksTest, ASmallStackIsRaisedByTheStaticTls) {
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 100 * 1024), 0);
  size_t size = 0;
  ASSERT_EQ(pthread_attr_getstacksize(&attr, &size), 0);
  EXPECT_EQ(size, 100 * 1024 + StaticTlsBytes());
  // Without the raise glibc refuses the thread: EINVAL, as civetweb's was.
  pthread_t thread;
  int seen = 0;
  ASSERT_EQ(pthread_create(&thread, &attr, TouchTls, &seen), 0);
  ASSERT_EQ(pthread_join(thread, nullptr), 0);
  EXPECT_EQ(seen, 1);
  pthread_attr_destroy(&attr);
}

TEST(ThreadStacksTest, TheCLibrarysAnswersPassThrough) {
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  EXPECT_EQ(pthread_attr_setstacksize(&attr, 0), EINVAL);
  pthread_attr_destroy(&attr);
}

}  // namespace
}  // namespace monsoon::common
