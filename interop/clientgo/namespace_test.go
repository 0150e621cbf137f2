package clientgo

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNamespaceSubresources: client-go's Namespaces().UpdateStatus and Finalize, the two
// subresources (namespaces/status, namespaces/finalize) that kube-controller-manager's
// namespace controller writes through.
func TestNamespaceSubresources(t *testing.T) {
	tg := getTarget(t)
	ctx := context.Background()
	name := newNamespace(t, tg, "nssub")
	namespaces := tg.kube.CoreV1().Namespaces()

	t.Run("UpdateStatus", func(t *testing.T) {
		ns, err := namespaces.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ns.Status.Phase != corev1.NamespaceActive {
			t.Fatalf("phase %q, want Active", ns.Status.Phase)
		}
		ns.Status.Conditions = []corev1.NamespaceCondition{{
			Type: corev1.NamespaceDeletionDiscoveryFailure, Status: corev1.ConditionFalse, Reason: "InteropTest",
			LastTransitionTime: metav1.Now(),
		}}
		out, err := namespaces.UpdateStatus(ctx, ns, metav1.UpdateOptions{})
		if err != nil {
			t.Fatalf("update status: %v", err)
		}
		if len(out.Status.Conditions) != 1 || out.Status.Conditions[0].Reason != "InteropTest" {
			t.Fatalf("conditions after /status %v", out.Status.Conditions)
		}
	})

	t.Run("Finalize", func(t *testing.T) {
		ns, err := namespaces.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ns.Spec.Finalizers = nil
		out, err := namespaces.Finalize(ctx, ns, metav1.UpdateOptions{})
		if err != nil {
			t.Fatalf("finalize: %v", err)
		}
		if len(out.Spec.Finalizers) != 0 {
			t.Fatalf("spec.finalizers after finalize %v", out.Spec.Finalizers)
		}
	})

	t.Run("Invalid", func(t *testing.T) {
		ns, err := namespaces.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		terminating := ns.DeepCopy()
		terminating.Status.Phase = corev1.NamespaceTerminating
		if _, err := namespaces.UpdateStatus(ctx, terminating, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
			t.Errorf("phase Terminating without a deletion through /status: %v, want 422 Invalid", err)
		}
		bad := ns.DeepCopy()
		bad.Spec.Finalizers = []corev1.FinalizerName{"not a name!"}
		if _, err := namespaces.Finalize(ctx, bad, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
			t.Errorf("an invalid finalizer through /finalize: %v, want 422 Invalid", err)
		}
		// A plain update changes neither the status nor spec.finalizers.
		plain := ns.DeepCopy()
		plain.Spec.Finalizers = []corev1.FinalizerName{"example.com/x"}
		plain.Status.Conditions = nil
		out, err := namespaces.Update(ctx, plain, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Spec.Finalizers) != len(ns.Spec.Finalizers) || len(out.Status.Conditions) != len(ns.Status.Conditions) {
			t.Errorf("a plain update changed spec.finalizers or the status: %v %v", out.Spec.Finalizers, out.Status.Conditions)
		}
	})
}
