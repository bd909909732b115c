package nn

import (
	"slices"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

func TestSnakeCase(t *testing.T) {
	for in, want := range map[string]string{
		"Conv1": "conv1", "FC1": "fc1", "RunningMean": "running_mean", "QKV": "qkv",
		"LNFinal": "ln_final", "NumBatchesTracked": "num_batches_tracked", "Weight": "weight",
		"AttnProj": "attn_proj", "X": "x", "LayerNorm2": "layer_norm2",
	} {
		if got := SnakeCase(in); got != want {
			t.Errorf("SnakeCase(%q) = %q, want %q", in, got, want)
		}
	}
}

// modeProbe records the mode SetTraining gave it.
type modeProbe struct {
	Scale    *tensor.Tensor
	training bool
}

func (m *modeProbe) Forward(x *tensor.Tensor) *tensor.Tensor { return x }
func (m *modeProbe) SetTraining(on bool)                     { m.training = on }

type block struct {
	Norm *modeProbe
	Proj *Linear
}

func (b *block) Forward(x *tensor.Tensor) *tensor.Tensor { return b.Proj.Forward(x) }

type net struct {
	Embed     *Linear
	Blocks    []*block
	Head      Module  `nn:"lm_head"`
	Skipped   *Linear `nn:"-"`
	Mask      *tensor.Tensor
	unexposed *Linear
	Tied      *Linear // the same layer as Embed: explicitLister once
}

func (n *net) Forward(x *tensor.Tensor) *tensor.Tensor { return x }

func names(ps []Parameter) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

func TestParametersFromFields(t *testing.T) {
	b := tensor.CPU
	probe := func() *modeProbe { return &modeProbe{Scale: tensor.Full(b, nil, 1, 2).SetRequiresGrad(true)} }
	embed := NewLinear(b, nil, 2, 2)
	m := &net{
		Embed:     embed,
		Blocks:    []*block{{Norm: probe(), Proj: NewLinear(b, nil, 2, 2)}, {Norm: probe(), Proj: NewLinear(b, nil, 2, 2)}},
		Head:      NewSequential(NewLinear(b, nil, 2, 3), ReLU{}),
		Skipped:   NewLinear(b, nil, 2, 2),
		Mask:      tensor.Zeros(b, nil, 2, 2),
		unexposed: NewLinear(b, nil, 2, 2),
		Tied:      embed,
	}
	want := []string{"embed.weight", "embed.bias",
		"blocks.0.norm.scale", "blocks.0.proj.weight", "blocks.0.proj.bias",
		"blocks.1.norm.scale", "blocks.1.proj.weight", "blocks.1.proj.bias",
		"lm_head.0.weight", "lm_head.0.bias"}
	if got := names(Parameters(m)); !slices.Equal(got, want) {
		t.Errorf("Parameters:\n got %v\nwant %v", got, want)
	}
	if got := names(Buffers(m)); !slices.Equal(got, []string{"mask"}) {
		t.Errorf("Buffers = %v, want [mask]", got)
	}
	if got := len(StateTensors(m)); got != len(want)+1 {
		t.Errorf("StateTensors has %d entries, want %d", got, len(want)+1)
	}
	SetTraining(m, true)
	for i, bl := range m.Blocks {
		if !bl.Norm.training {
			t.Errorf("block %d not in training mode after SetTraining(true)", i)
		}
	}
	SetTraining(m, false)
	if m.Blocks[1].Norm.training {
		t.Error("block 1 still in training mode after SetTraining(false)")
	}
}

// An explicit Parameters method wins over the fields.
type explicitLister struct{ A, B *Linear }

func (l *explicitLister) Forward(x *tensor.Tensor) *tensor.Tensor { return x }
func (l *explicitLister) Parameters() []Parameter                 { return Prefixed("only", l.B.Parameters()) }

func TestExplicitParametersWin(t *testing.T) {
	l := &explicitLister{A: NewLinear(tensor.CPU, nil, 2, 2), B: NewLinear(tensor.CPU, nil, 2, 2)}
	outer := NewSequential(l)
	want := []string{"0.only.weight", "0.only.bias"}
	if got := names(Parameters(outer)); !slices.Equal(got, want) {
		t.Errorf("Parameters = %v, want %v", got, want)
	}
}

// scaledLinear embeds a layer and adds a tensor of its own: Go promotes
// Linear's Parameters method, which must not hide Scale.
type scaledLinear struct {
	*Linear
	Scale *tensor.Tensor
}

func (s *scaledLinear) Forward(x *tensor.Tensor) *tensor.Tensor { return s.Linear.Forward(x) }

// byValue holds its layer as a struct value (Forward is on the pointer).
type byValue struct{ FC Linear }

func (b *byValue) Forward(x *tensor.Tensor) *tensor.Tensor { return b.FC.Forward(x) }

// tied shares one weight tensor between two layers.
type tied struct{ A, B *Linear }

func (t *tied) Forward(x *tensor.Tensor) *tensor.Tensor { return x }

// bufferOnly lists its buffers itself and has none in fields besides.
type bufferOnly struct{ Stat *tensor.Tensor }

func (b *bufferOnly) Forward(x *tensor.Tensor) *tensor.Tensor { return x }
func (b *bufferOnly) Buffers() []Parameter                    { return []Parameter{{"stat", b.Stat}} }

func TestParametersEdgeCases(t *testing.T) {
	b := tensor.CPU
	s := &scaledLinear{Linear: NewLinear(b, nil, 2, 2), Scale: tensor.Full(b, nil, 1, 2).SetRequiresGrad(true)}
	if got, want := names(Parameters(s)), []string{"weight", "bias", "scale"}; !slices.Equal(got, want) {
		t.Errorf("embedded layer: %v, want %v", got, want)
	}
	v := &byValue{FC: *NewLinear(b, nil, 2, 3)}
	if got, want := names(Parameters(v)), []string{"fc.weight", "fc.bias"}; !slices.Equal(got, want) {
		t.Errorf("struct-valued layer: %v, want %v", got, want)
	}
	tt := &tied{A: NewLinear(b, nil, 2, 2), B: NewLinear(b, nil, 2, 2)}
	tt.B.Weight = tt.A.Weight
	if got, want := names(Parameters(tt)), []string{"a.weight", "a.bias", "b.bias"}; !slices.Equal(got, want) {
		t.Errorf("tied weight: %v, want %v (listed once, as torch does)", got, want)
	}
	bo := &bufferOnly{Stat: tensor.Zeros(b, nil, 3)}
	if got, want := names(Buffers(bo)), []string{"stat"}; !slices.Equal(got, want) {
		t.Errorf("a Buffers method: %v, want %v (listed once)", got, want)
	}
}
