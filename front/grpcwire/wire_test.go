package grpcwire

import (
	"bytes"
	"io"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestParseTimeout(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		bad  bool
	}{
		{"1H", time.Hour, false},
		{"2M", 2 * time.Minute, false},
		{"3S", 3 * time.Second, false},
		{"200m", 200 * time.Millisecond, false},
		{"5u", 5 * time.Microsecond, false},
		{"99999999n", 99999999, false},
		{"99999999H", 1<<63 - 1, false},
		{"0S", 0, false},
		{"S", 0, true},
		{"", 0, true},
		{"123456789S", 0, true},
		{"10s", 0, true},
		{"1.5S", 0, true},
		{"-1S", 0, true},
	} {
		got, err := parseTimeout(tc.in)
		if (err != nil) != tc.bad || !tc.bad && got != tc.want {
			t.Errorf("parseTimeout(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

func TestEncodeMessage(t *testing.T) {
	for in, want := range map[string]string{
		"plain text":    "plain text",
		"100%":          "100%25",
		"line\nbreak":   "line%0Abreak",
		"ünicode":       "%C3%BCnicode",
		"tab\tand\x7f.": "tab%09and%7F.",
	} {
		if got := encodeMessage(in); got != want {
			t.Errorf("encodeMessage(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestHpackBlocks: the prebuilt and built header blocks decode, with the
// dynamic table left empty, to what they say.
func TestHpackBlocks(t *testing.T) {
	st, _ := status.New(codes.NotFound, "gone 100%").WithDetails(&wrapperspb.StringValue{Value: "d"})
	for _, tc := range []struct {
		name  string
		block []byte
		want  string
	}{
		{"response headers", responseHeaders, ":status=200 content-type=application/grpc "},
		{"ok trailers", okTrailers, "grpc-status=0 "},
		{"trailers-only 415", appendStatus(nil, status.New(codes.InvalidArgument, "x"), true, 415), ":status=415 content-type=application/grpc grpc-status=3 grpc-message=x "},
		{"trailers with details", appendStatus(nil, st, false, 200), "grpc-status=5 grpc-message=gone 100%25 grpc-status-details-bin="},
	} {
		var got bytes.Buffer
		d := hpack.NewDecoder(4096, func(f hpack.HeaderField) {
			got.WriteString(f.Name + "=")
			if f.Name != "grpc-status-details-bin" {
				got.WriteString(f.Value + " ")
			}
		})
		if _, err := d.Write(tc.block); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got.String() != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got.String(), tc.want)
		}
	}
	// A long value takes a multi-byte length.
	long := string(bytes.Repeat([]byte("a"), 300))
	var got string
	d := hpack.NewDecoder(4096, func(f hpack.HeaderField) { got = f.Value })
	if _, err := d.Write(appendLiteral(nil, "x", long)); err != nil || got != long {
		t.Errorf("300-byte value: %v, %d bytes back", err, len(got))
	}
}

// TestNetHTTPTransport: net/http's HTTP/2 client (x/net's, bundled), in
// clear text with prior knowledge, makes a call and reads its trailers.
func TestNetHTTPTransport(t *testing.T) {
	_, _, _, addr := testServer(t, Options{})
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	body := message(t, &wrapperspb.BytesValue{Value: []byte("x/net")})
	req, err := http.NewRequest("POST", "http://"+addr+echoPath, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("TE", "trailers")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.ProtoMajor != 2 || resp.StatusCode != 200 || !bytes.Equal(got, body) || resp.Trailer.Get("Grpc-Status") != "0" {
		t.Errorf("answer %s %d %q trailers %v, want HTTP/2.0 200, the message back and grpc-status 0", resp.Proto, resp.StatusCode, got, resp.Trailer)
	}
}

// TestStandalone: which header blocks read and write no dynamic table.
func TestStandalone(t *testing.T) {
	enc := func(sensitive bool, fields ...string) []byte {
		var b bytes.Buffer
		e := hpack.NewEncoder(&b)
		for i := 0; i+1 < len(fields); i += 2 {
			_ = e.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1], Sensitive: sensitive})
		}
		return b.Bytes()
	}
	long := string(bytes.Repeat([]byte("v"), 300))
	never := enc(true, ":method", "POST", ":path", "/a.B/C", "x-custom", long)
	var twice bytes.Buffer
	e := hpack.NewEncoder(&twice)
	_ = e.WriteField(hpack.HeaderField{Name: "x-a", Value: "1"})
	twice.Reset()
	_ = e.WriteField(hpack.HeaderField{Name: "x-a", Value: "1"}) // now indexed in the dynamic table
	var resized bytes.Buffer
	e = hpack.NewEncoder(&resized)
	e.SetMaxDynamicTableSize(0)
	_ = e.WriteField(hpack.HeaderField{Name: ":method", Value: "POST"})
	for _, tc := range []struct {
		name  string
		block []byte
		want  bool
	}{
		{"empty", nil, true},
		{"static indexed", []byte{0x83, 0x86}, true},
		{"never indexed, literal names and long values", never, true},
		{"not indexed, static name", []byte{0x04, 0x02, '/', 'x'}, true},
		{"indexed 0", []byte{0x80}, false},
		{"indexed beyond the static table", []byte{0x80 | 62}, false},
		{"literal with indexing", enc(false, "x-new", "1"), false},
		{"dynamic table reference", twice.Bytes(), false},
		{"size update", resized.Bytes(), false},
		{"name index beyond the static table", []byte{0x0f, 62 - 15, 0x01, 'x'}, false},
		{"truncated string", never[:len(never)-1], false},
		{"truncated integer", []byte{0x0f}, false},
		{"huge integer", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, false},
	} {
		if got := standalone(tc.block); got != tc.want {
			t.Errorf("%s: standalone %v, want %v", tc.name, got, tc.want)
		}
	}
}
