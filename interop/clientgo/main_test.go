package clientgo

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	// WatchListClient is on by default in client-go 1.35 and later; say so explicitly so that
	// a client-go upgrade that changes the default cannot silently turn the WatchList test
	// into a list test. client-go reads this once, on first use.
	if err := os.Setenv("KUBE_FEATURE_WatchListClient", "true"); err != nil {
		panic(err)
	}
	// ClientsAllowCBOR lets a client that asks for CBOR (TestCBORCoreGroup) use it; clients that
	// do not ask are unchanged (ClientsPreferCBOR stays off).
	if err := os.Setenv("KUBE_FEATURE_ClientsAllowCBOR", "true"); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}
