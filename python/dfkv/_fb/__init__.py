"""FlatBuffers code generated from schema/*.fbs by tools/gen.sh. Do not edit."""
