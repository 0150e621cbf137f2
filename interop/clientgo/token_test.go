package clientgo

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

type reviewResult struct {
	audiences     []string
	authenticated bool
	username      string
	groups        []string
	errText       string
}

// tokenReview posts a TokenReview (authentication.k8s.io/v1, authentication.svc.io/v1 on the
// gateway) with the dynamic client.
func tokenReview(t *testing.T, ctx context.Context, tg *target, token string) reviewResult {
	t.Helper()
	return tokenReviewAudiences(t, ctx, tg, token, nil)
}

func tokenReviewAudiences(t *testing.T, ctx context.Context, tg *target, token string, audiences []string) reviewResult {
	t.Helper()
	spec := map[string]any{"token": token}
	if audiences != nil {
		var a []any
		for _, s := range audiences {
			a = append(a, s)
		}
		spec["audiences"] = a
	}
	review := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": tg.group("authentication") + "/v1",
		"kind":       "TokenReview",
		"spec":       spec,
	}}
	out, err := tg.dyn.Resource(tg.gvr("authentication", "tokenreviews")).Create(ctx, review, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenReview: %v", err)
	}
	var r reviewResult
	r.authenticated, _, _ = unstructured.NestedBool(out.Object, "status", "authenticated")
	r.username, _, _ = unstructured.NestedString(out.Object, "status", "user", "username")
	r.groups, _, _ = unstructured.NestedStringSlice(out.Object, "status", "user", "groups")
	r.errText, _, _ = unstructured.NestedString(out.Object, "status", "error")
	r.audiences, _, _ = unstructured.NestedStringSlice(out.Object, "status", "audiences")
	return r
}

// TestTokenRequestAndReview: the typed TokenRequest (serviceaccounts/NAME/token), a
// TokenReview of the token, the token used as a bearer credential (authenticated, then
// forbidden by RBAC), a token bound to a Secret that stops working when the Secret is
// deleted, and a TokenReview of garbage.
func TestTokenRequestAndReview(t *testing.T) {
	tg := getTarget(t)
	ctx := context.Background()
	ns := newNamespace(t, tg, "tok")
	core := tg.kube.CoreV1()
	if _, err := core.ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "robot"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expiry := int64(600)
	before := time.Now()
	tr, err := core.ServiceAccounts(ns).CreateToken(ctx, "robot", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest: %v", err)
	}
	if tr.Status.Token == "" || strings.Count(tr.Status.Token, ".") != 2 {
		t.Fatalf("token %q is not a JWT", tr.Status.Token)
	}
	if d := tr.Status.ExpirationTimestamp.Sub(before); d < 590*time.Second || d > 660*time.Second {
		t.Fatalf("expirationTimestamp %v is %v from now, want about 600 s", tr.Status.ExpirationTimestamp, d)
	}

	wantUser := "system:serviceaccount:" + ns + ":robot"
	r := tokenReview(t, ctx, tg, tr.Status.Token)
	if !r.authenticated || r.username != wantUser {
		t.Fatalf("TokenReview %+v, want authenticated as %s", r, wantUser)
	}
	for _, g := range []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"} {
		if !slices.Contains(r.groups, g) {
			t.Fatalf("TokenReview groups %v lack %s", r.groups, g)
		}
	}

	// The token as a bearer credential: authenticated, and RBAC grants it nothing.
	bearer := rest.AnonymousClientConfig(tg.cfg)
	bearer.BearerToken = tr.Status.Token
	bc, err := kubernetes.NewForConfig(bearer)
	if err != nil {
		t.Fatal(err)
	}
	_, err = bc.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), wantUser) {
		t.Fatalf("list secrets with the token: %v, want 403 naming %s", err, wantUser)
	}

	// A token bound to a Secret is valid while the Secret exists.
	s, err := core.Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "anchor"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bound, err := core.ServiceAccounts(ns).CreateToken(ctx, "robot", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: &expiry,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Secret", APIVersion: "v1", Name: s.Name, UID: s.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("bound TokenRequest: %v", err)
	}
	if r := tokenReview(t, ctx, tg, bound.Status.Token); !r.authenticated {
		t.Fatalf("bound token while its Secret exists: %+v", r)
	}
	if err := core.Secrets(ns).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "bound token rejected once its Secret is gone", func() error {
		if r := tokenReview(t, ctx, tg, bound.Status.Token); r.authenticated {
			return errString("still authenticated")
		}
		return nil
	})

	// Audiences: a token for a custom audience is valid for that audience only.
	custom, err := core.ServiceAccounts(ns).CreateToken(ctx, "robot", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry, Audiences: []string{"interop.example.com"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest with an audience: %v", err)
	}
	if !slices.Equal(custom.Spec.Audiences, []string{"interop.example.com"}) {
		t.Fatalf("TokenRequest answered audiences %v", custom.Spec.Audiences)
	}
	if r := tokenReviewAudiences(t, ctx, tg, custom.Status.Token, []string{"interop.example.com"}); !r.authenticated || !slices.Equal(r.audiences, []string{"interop.example.com"}) {
		t.Fatalf("TokenReview for its audience: %+v", r)
	}
	if r := tokenReview(t, ctx, tg, custom.Status.Token); r.authenticated {
		t.Fatalf("a token for another audience was accepted for the server's own: %+v", r)
	}

	if r := tokenReview(t, ctx, tg, "not-a-token"); r.authenticated || r.errText == "" {
		t.Fatalf("TokenReview of garbage %+v, want authenticated=false with an error", r)
	}

	// TokenRequest for a ServiceAccount that does not exist.
	_, err = core.ServiceAccounts(ns).CreateToken(ctx, "nobody", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("TokenRequest for a missing ServiceAccount: %v, want 404", err)
	}
}

type errString string

func (e errString) Error() string { return string(e) }
