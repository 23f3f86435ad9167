#include "common/thread_stacks.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>

namespace monsoon::common {

size_t StaticTlsBytes() {
  size_t total = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& header = info->dlpi_phdr[i];
          if (header.p_type != PT_TLS) continue;
          const size_t align = header.p_align > 0 ? header.p_align : 1;
          *static_cast<size_t*>(data) +=
              (header.p_memsz + align - 1) / align * align;
        }
        return 0;
      },
      &total);
  return total;
}

}  // namespace monsoon::common

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr,
                                         size_t stacksize) {
  using SetFn = int (*)(pthread_attr_t*, size_t);
  static const SetFn real =
      reinterpret_cast<SetFn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  // Measured once: modules loaded later with dlopen get their TLS
  // elsewhere (dynamically), not from the stack.
  static const size_t tls = monsoon::common::StaticTlsBytes();
  if (real == nullptr) return ENOSYS;
  if (stacksize == 0) return real(attr, stacksize);
  return real(attr, stacksize + tls);
}
