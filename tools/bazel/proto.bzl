"""cc_grpc_proto: C++ (and gRPC) code from one .proto with the system protoc."""

def cc_grpc_proto(name, src, grpc = True, deps = [], **kwargs):
    """Generates <src>.pb.{h,cc} (and .grpc.pb.{h,cc}) and wraps them.

    Args:
      name: the cc_library to define.
      src: one .proto file in this package.
      grpc: whether the file declares services.
      deps: cc_grpc_proto targets whose .proto files `src` imports.
      **kwargs: passed to cc_library.
    """
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc"]
    if grpc:
        outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    grpc_flags = ""
    if grpc:
        grpc_flags = "--plugin=protoc-gen-grpc=$$(which grpc_cpp_plugin) --grpc_out=$(GENDIR) "
    dep_srcs = [d + "_src" for d in deps]
    native.filegroup(name = name + "_src", srcs = [src] + dep_srcs)
    native.genrule(
        name = name + "_gen",
        srcs = [src] + dep_srcs,
        outs = outs,
        cmd = ("protoc -I. --cpp_out=$(GENDIR) " + grpc_flags +
               "$(location " + src + ")"),
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["//tools/bazel:protobuf"] + (["//tools/bazel:grpc"] if grpc else []),
        **kwargs
    )
