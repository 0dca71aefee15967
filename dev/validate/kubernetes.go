package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// strictDecoder decodes into the registered API types and fails on unknown
// fields, duplicate fields and kinds it does not know.
func strictDecoder() (runtime.Decoder, error) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme,
		appsv1.AddToScheme,
		batchv1.AddToScheme,
		policyv1.AddToScheme,
		networkingv1.AddToScheme,
		monitoringv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	factory := serializer.NewCodecFactory(scheme, serializer.EnableStrict)
	return factory.UniversalDeserializer(), nil
}

func kubernetes(in io.Reader, out io.Writer) error {
	decoder, err := strictDecoder()
	if err != nil {
		return err
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(in))
	count := 0
	var problems []string
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if strings.TrimSpace(stripComments(string(doc))) == "" {
			continue
		}
		count++
		obj, gvk, err := decoder.Decode(doc, nil, nil)
		if err != nil {
			problems = append(problems, fmt.Sprintf("document %d: %v", count, err))
			continue
		}
		accessor, err := meta.Accessor(obj)
		if err != nil {
			return err
		}
		where := fmt.Sprintf("%s/%s", gvk.Kind, accessor.GetName())
		for _, msg := range metadataProblems(accessor) {
			problems = append(problems, where+": "+msg)
		}
		fmt.Fprintln(out, where)
	}
	if count == 0 {
		return errors.New("no manifests on stdin")
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n"))
	}
	return nil
}

// metadataProblems checks what the API server checks of every object's
// metadata: a DNS-1123 name and valid label keys and values.
func metadataProblems(obj metav1.Object) []string {
	var out []string
	for _, msg := range validation.IsDNS1123Subdomain(obj.GetName()) {
		out = append(out, "name: "+msg)
	}
	for key, value := range obj.GetLabels() {
		for _, msg := range validation.IsQualifiedName(key) {
			out = append(out, fmt.Sprintf("label %q: %s", key, msg))
		}
		for _, msg := range validation.IsValidLabelValue(value) {
			out = append(out, fmt.Sprintf("label %q value %q: %s", key, value, msg))
		}
	}
	return out
}

func stripComments(doc string) string {
	var kept []string
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			kept = append(kept, line)
		}
	}
	return strings.Join(kept, "\n")
}
