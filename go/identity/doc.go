// Package identity derives the 128-bit object id and the 64-bit tenant hash that name every
// value in dfkv. Both are bit-exact contracts shared with the Python codec through golden
// vectors in testdata/golden/identity.json (outputs from the independent
// generator testdata/golden/gen_golden.py): changing either breaks every stored key.
package identity
