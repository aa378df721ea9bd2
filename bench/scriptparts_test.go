package main

import "testing"

// TestScriptPartsVariants: every variant of scriptparts.go still cuts what
// its name says from redislock's scripts as they are now. A script edited
// so that a cut no longer matches would otherwise be measured under the
// cut's name, unchanged (partVariants refuses that; this test tells it
// before a measuring run does).
func TestScriptPartsVariants(t *testing.T) {
	acq, rel, err := readScripts("../redislock")
	if err != nil {
		t.Fatal(err)
	}
	vs, err := partVariants(acq, rel)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs[1:] {
		if v.src == acq && v.keys == 5 && v.args == 5 && v.name != "acquire: ARGV[1] owner only (32 bytes)" {
			t.Errorf("%s: the acquire script as it is, called as it is", v.name)
		}
	}
}
