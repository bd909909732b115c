package nn

import (
	"reflect"
	"strconv"
	"strings"
	"unicode"

	"github.com/ember-ml/ember/tensor"
)

// A model is a Go struct: its fields are its parameters, buffers and
// children, named as PyTorch names a module's attributes, so that the same
// network written in Go and in PyTorch has the same state_dict keys.
//
//   - A *tensor.Tensor field is a parameter when it requires a gradient and
//     a buffer otherwise.
//   - A field holding a Module (a pointer to a layer, or an interface) is a
//     child; its entries get the field's name and a dot before theirs.
//   - A slice or array of modules numbers its children "0", "1", ..., as
//     torch.nn.ModuleList does.
//   - A field is named in snake_case from its Go name (Conv1 → conv1, FC1 →
//     fc1, RunningMean → running_mean, QKV → qkv); the tag `nn:"name"`
//     renames it and `nn:"-"` leaves it out. Embedded structs add their
//     fields without a prefix. Unexported fields are skipped.
//
// A module with a Parameters (or Buffers) method lists its own entries
// instead, and is not searched.

// Parameters lists the learnable tensors of m and its children, each named
// with its state_dict key, in field order. A tensor reachable twice (a
// weight tied between two layers) is listed once, as torch lists it.
func Parameters(m any) []Parameter {
	var out []Parameter
	walk(m, "", func(prefix string, v any) bool {
		if pl, ok := v.(ParameterLister); ok && ownMethod(v, listerType) {
			out = append(out, withPrefix(prefix, pl.Parameters())...)
			return false
		}
		return true
	}, func(name string, t *tensor.Tensor) {
		if t.RequiresGrad() {
			out = append(out, Parameter{Name: name, Tensor: t})
		}
	})
	return firstOfEach(out)
}

// firstOfEach drops the entries whose tensor an earlier entry already
// names (a tied weight that two layers list).
func firstOfEach(ps []Parameter) []Parameter {
	seen := map[*tensor.Tensor]bool{}
	out := ps[:0]
	for _, p := range ps {
		if p.Tensor != nil && seen[p.Tensor] {
			continue
		}
		seen[p.Tensor] = true
		out = append(out, p)
	}
	return out
}

// Buffers lists the tensors of m and its children that are saved with the
// model but not learnt (running statistics), named like Parameters.
func Buffers(m any) []Parameter {
	var out []Parameter
	walk(m, "", func(prefix string, v any) bool {
		if bl, ok := v.(BufferLister); ok && ownMethod(v, bufferListerType) {
			out = append(out, withPrefix(prefix, bl.Buffers())...)
			return false
		}
		_, lists := v.(ParameterLister)
		return !(lists && ownMethod(v, listerType))
	}, func(name string, t *tensor.Tensor) {
		if !t.RequiresGrad() {
			out = append(out, Parameter{Name: name, Tensor: t})
		}
	})
	return firstOfEach(out)
}

var (
	listerType       = reflect.TypeFor[ParameterLister]()
	bufferListerType = reflect.TypeFor[BufferLister]()
)

// ownMethod reports whether v's method of iface is its own rather than
// promoted from an embedded field: a struct that embeds a layer (Go hands
// it the layer's Parameters) is searched field by field, so that its own
// tensors are found beside the layer's.
func ownMethod(v any, iface reflect.Type) bool {
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return true
	}
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && (f.Type.Implements(iface) || reflect.PointerTo(f.Type).Implements(iface)) {
			return false
		}
	}
	return true
}

// StateTensors lists the parameters and then the buffers of m: every
// tensor a checkpoint of the model holds.
func StateTensors(m any) []Parameter { return append(Parameters(m), Buffers(m)...) }

// Trainer is a module whose behaviour differs between training and
// evaluation (BatchNorm, Dropout).
type Trainer interface {
	SetTraining(on bool)
}

// SetTraining puts m and every module inside it in training mode (on) or
// evaluation mode, as torch's module.train(on) does.
func SetTraining(m any, on bool) {
	walk(m, "", func(_ string, v any) bool {
		if t, ok := v.(Trainer); ok {
			t.SetTraining(on)
		}
		return true
	}, func(string, *tensor.Tensor) {})
}

func withPrefix(prefix string, ps []Parameter) []Parameter {
	if prefix == "" {
		return ps
	}
	return Prefixed(strings.TrimSuffix(prefix, "."), ps)
}

var tensorType = reflect.TypeFor[*tensor.Tensor]()

// walk visits m and the modules inside it depth first. enter is called on
// every module (with the prefix of its entries) and says whether to look
// inside it; leaf is called on every tensor field of a module looked into.
func walk(m any, prefix string, enter func(prefix string, v any) bool, leaf func(name string, t *tensor.Tensor)) {
	// Modules are known by address and type: a struct's first field has
	// the struct's address.
	type moduleKey struct {
		p uintptr
		t reflect.Type
	}
	seen := map[moduleKey]bool{}
	seenTensor := map[*tensor.Tensor]bool{}
	onceLeaf := func(name string, t *tensor.Tensor) {
		if !seenTensor[t] {
			seenTensor[t] = true
			leaf(name, t)
		}
	}
	var visit func(v reflect.Value, prefix string, isModule bool)
	visit = func(v reflect.Value, prefix string, isModule bool) {
		for v.Kind() == reflect.Interface && !v.IsNil() {
			v = v.Elem()
		}
		if (v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface) && v.IsNil() {
			return
		}
		if isModule && v.CanInterface() {
			if v.Kind() == reflect.Pointer {
				k := moduleKey{v.Pointer(), v.Type()}
				if seen[k] {
					return // a module shared by two fields is listed once, as torch does
				}
				seen[k] = true
			}
			if !enter(prefix, v.Interface()) {
				return
			}
		}
		if v.Kind() == reflect.Pointer {
			v = v.Elem()
		}
		switch v.Kind() {
		case reflect.Struct:
			t := v.Type()
			for i := range t.NumField() {
				f := t.Field(i)
				if !f.IsExported() {
					continue
				}
				name, skip := fieldName(f)
				if skip {
					continue
				}
				fv := v.Field(i)
				if f.Anonymous {
					// An embedded layer's entries are the struct's own, with
					// no prefix; an embedded plain struct's fields too.
					if mv, ok := moduleOf(fv); ok {
						visit(mv, prefix, true)
					} else if fv.Kind() == reflect.Struct {
						visit(fv, prefix, false)
					}
					continue
				}
				visitField(fv, prefix+name, onceLeaf, visit)
			}
		case reflect.Slice, reflect.Array:
			for i := range v.Len() {
				visitField(v.Index(i), prefix+strconv.Itoa(i), onceLeaf, visit)
			}
		}
	}
	visit(reflect.ValueOf(m), prefix, true)
}

// visitField handles one named entry: a tensor, a module, or a list of
// either.
func visitField(fv reflect.Value, name string, leaf func(string, *tensor.Tensor), visit func(reflect.Value, string, bool)) {
	if fv.Type() == tensorType {
		if !fv.IsNil() {
			leaf(name, fv.Interface().(*tensor.Tensor))
		}
		return
	}
	if mv, ok := moduleOf(fv); ok {
		visit(mv, name+".", true)
		return
	}
	if k := fv.Kind(); k == reflect.Slice || k == reflect.Array {
		visit(fv, name+".", false)
	}
}

// moduleOf returns the module a field holds: the field itself (a pointer
// to a layer, an interface), or the address of a struct-valued field whose
// pointer is a Module (layers define Forward on the pointer).
func moduleOf(v reflect.Value) (reflect.Value, bool) {
	if !v.CanInterface() {
		return v, false
	}
	if v.Kind() == reflect.Interface {
		if v.IsNil() {
			return v, false
		}
		v = v.Elem()
	}
	if _, ok := v.Interface().(Module); ok {
		return v, true
	}
	if v.Kind() == reflect.Struct && v.CanAddr() {
		if _, ok := v.Addr().Interface().(Module); ok {
			return v.Addr(), true
		}
	}
	return v, false
}

// fieldName is the state_dict name of a struct field.
func fieldName(f reflect.StructField) (name string, skip bool) {
	if tag, ok := f.Tag.Lookup("nn"); ok {
		if tag == "-" {
			return "", true
		}
		if tag != "" {
			return tag, false
		}
	}
	return SnakeCase(f.Name), false
}

// SnakeCase turns a Go field name into the snake_case a PyTorch attribute
// would have: a run of capitals is one word (FC1 → fc1, QKV → qkv), and a
// capital that starts a new word after lower case or after a run of
// capitals gets an underscore (RunningMean → running_mean, LNFinal →
// ln_final).
func SnakeCase(s string) string {
	rs := []rune(s)
	var b strings.Builder
	for i, r := range rs {
		if unicode.IsUpper(r) && i > 0 {
			prev := rs[i-1]
			nextLower := i+1 < len(rs) && unicode.IsLower(rs[i+1])
			if unicode.IsLower(prev) || (unicode.IsUpper(prev) && nextLower) {
				b.WriteByte('_')
			}
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}
