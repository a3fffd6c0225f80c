"""FlatBuffers codegen inside the graph: the same flatc invocations as tools/gen.sh."""

_HEADER = '"""FlatBuffers code generated from schema/*.fbs by tools/gen.sh. Do not edit."""'

def fb_codegen(name, schemas, **kwargs):
    """Generates go/<schema>_generated.go and py/<schema>_generated.py (+ py/__init__.py).

    Args:
      name: the genrule's name.
      schemas: the .fbs files of this package (one output of each language per schema).
      **kwargs: passed to the genrule.
    """
    bases = [s[:-len(".fbs")] for s in schemas]
    go_outs = ["go/%s_generated.go" % b for b in bases]
    py_outs = ["py/%s_generated.py" % b for b in bases] + ["py/__init__.py"]
    native.genrule(
        name = name,
        srcs = schemas,
        outs = go_outs + py_outs,
        tools = ["@flatbuffers_src//:flatc", "//bazel/gofmt"],
        cmd = " && ".join([
            "$(execpath @flatbuffers_src//:flatc) --go --go-namespace fb --gen-onefile -o $(RULEDIR)/go $(SRCS)",
            "$(execpath //bazel/gofmt) " + " ".join(["$(RULEDIR)/" + o for o in go_outs]),
            "$(execpath @flatbuffers_src//:flatc) --python --gen-onefile -o $(RULEDIR)/py $(SRCS)",
            "echo '%s' > $(RULEDIR)/py/__init__.py" % _HEADER,
        ]),
        **kwargs
    )
