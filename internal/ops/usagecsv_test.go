package ops

import "testing"

func TestCSVText(t *testing.T) {
	for in, want := range map[string]string{
		"":             "",
		"alice":        "alice",
		"=1+1":         "'=1+1",
		"+1":           "'+1",
		"-1":           "'-1",
		"@SUM(A1)":     "'@SUM(A1)",
		"\t=1":         "'\t=1",
		"\r=1":         "'\r=1",
		"a=b":          "a=b",
		"'already":     "'already",
		"req-1,with,,": "req-1,with,,",
	} {
		if got := csvText(in); got != want {
			t.Errorf("csvText(%q) = %q, want %q", in, got, want)
		}
	}
}
