#!/bin/sh
# tests/integration/editor_schemas.sh — the Neovim and Emacs packages write
# their protobuf schemas and enum names by hand: every field and value they
# know must match proto/llamad.proto, and every message they know must have
# all the .proto's fields but the oneof members (Request.op, Response.body:
# the operations an editor uses) (tests/tools/editor_schemas.py). No daemon,
# no editor needed.
python3 tests/tools/editor_schemas.py proto/llamad.proto client/nvim/lua/llamad/pb.lua \
    client/emacs/llamad-proto.el
